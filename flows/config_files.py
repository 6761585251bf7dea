"""Loading the run configuration: YAML presets (`configs/`, with `base:` inheritance),
`--set a.b=value` overrides, validation errors that name the field, and a stored config
brought to this version's form for the resume comparison."""

from __future__ import annotations

import contextlib
import copy
import os
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError
from pydantic_core import ErrorDetails

from flows.config import ItergrpoConfig
from flows.config_fields import close_fields, field_annotation, takes_text_only
from flows.errors import ConfigError
from flows.grpo_presets import layers_merged
from grpo_core.algo.config import migrate_replaced_fields
from grpo_core.data.tasks.registry import with_task_sections
from reward_models.config import migrate_replaced_fields as migrate_replaced_rm_fields

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"


class BooleanWord(str):
    """A bare YAML 1.1 boolean other than true/false (off, no, yes, on, y, n): the text as
    typed, and the boolean YAML 1.1 reads it as (`truth`)."""

    truth: bool


def _boolean_or_word(loader: yaml.SafeLoader, node: yaml.ScalarNode) -> bool | BooleanWord:
    truth = loader.construct_yaml_bool(node)
    if node.value.lower() in ("true", "false"):
        return truth
    word = BooleanWord(node.value)
    word.truth = truth
    return word


class _ConfigLoader(yaml.SafeLoader):
    """YAML as safe_load reads it, but for the YAML 1.1 words read as booleans beyond
    true/false, which stay BooleanWord until the field they set is known (`as_typed`)."""


_ConfigLoader.add_constructor("tag:yaml.org,2002:bool", _boolean_or_word)


def read_yaml(text: str) -> Any:
    """Config YAML: a bare off/no/yes becomes what its field takes (see `as_typed`)."""
    return yaml.load(text, Loader=_ConfigLoader)  # a SafeLoader: builds no objects


def as_typed(value: Any, path: tuple[str, ...] = ()) -> Any:
    """`value` (a config tree, or the value of the field at `path`) with each BooleanWord
    made the text typed where its field takes only text (`guards.rm_auroc: off`, a choice
    of stop|warn|off) and the boolean YAML 1.1 means everywhere else (`run.warm_start: no`,
    and keys outside the typed tree, as before)."""
    if isinstance(value, dict):
        return {
            str(key) if isinstance(key, BooleanWord) else key: as_typed(item, (*path, str(key)))
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [as_typed(item, path) for item in value]
    if isinstance(value, BooleanWord):
        return str(value) if takes_text_only(field_annotation(path)) else value.truth
    return value


def set_path(tree: dict[str, Any], dotted: str, value: Any) -> None:
    keys = dotted.split(".")
    node = tree
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {dotted}: '{key}' is a value, not a section")
        node = child
    node[keys[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """`a.b=value` -> ("a.b", value parsed as YAML, so 3, 0.5, true, [1, 2] keep their types)."""
    if "=" not in text:
        raise ConfigError(f"--set {text!r}: expected KEY=VALUE, e.g. grpo.steps=20")
    key, raw = text.split("=", 1)
    key = key.strip()
    if not key:
        raise ConfigError(f"--set {text!r}: empty key")
    value = as_typed(read_yaml(raw), tuple(key.split("."))) if raw.strip() else None
    quoted = raw.strip()[:1] in ("'", '"')  # '2' is the string 2 (a token, say)
    if isinstance(value, str) and not quoted:
        # YAML 1.1 reads 1e-5 (no dot) as a string; a number is what was meant.
        with contextlib.suppress(ValueError):
            value = float(value) if value.strip().lower() not in ("nan", "inf", "-inf") else value
    return key, value


def preset_names() -> list[str]:
    """The presets `--config NAME` accepts (configs/*.yaml)."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    """configs/<name>.yaml, or an error listing the presets (for a name that is not a path)."""
    path = CONFIG_DIR / f"{name}.yaml"
    if path.is_file():
        return path
    if Path(name).suffix in (".yaml", ".yml") or "/" in name or os.sep in name:
        raise ConfigError(f"config file not found: {name}; give an existing YAML file or a preset")
    raise ConfigError(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")


def _read_layers(path: str | Path, seen: tuple[Path, ...] = ()) -> list[dict[str, Any]]:
    """A YAML config (file or preset name) as its layers: with `base: NAME`, that preset's
    layers first, then this file's sections, so a variant states only what differs."""
    file = Path(path)
    if not file.is_file():
        file = preset_path(str(path))
    if file.resolve() in seen:
        raise ConfigError(f"{file}: 'base' presets form a cycle")
    try:
        loaded = read_yaml(file.read_text(encoding="utf-8")) or {}
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(f"{file}{where}: not valid YAML ({problem}); fix the file") from None
    if not isinstance(loaded, dict):
        raise ConfigError(f"{file}: top level must be a mapping of sections")
    # before merging: a base and its variant may differ in shape
    loaded = as_typed(task_sections_of(loaded))
    base = loaded.pop("base", None)
    if base is None:
        return [loaded]
    if not isinstance(base, str):
        raise ConfigError(f"{file}: base must be a preset name or YAML path (got {base!r})")
    return [*_read_layers(base, (*seen, file.resolve())), loaded]


def load_config(
    path: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    *,
    migrate: bool = False,
) -> ItergrpoConfig:
    """Read YAML (a path or a preset name, with its `base` preset), apply `a.b=value`
    overrides, validate. migrate: the overrides are stored ones of an earlier run (an
    ablation's suite), so fields renamed since are mapped to their new names first.
    A `grpo.preset` sets its fields over the layers before the one naming it
    (flows/grpo_presets.py)."""
    layers = _read_layers(path) if path is not None else []
    files = copy.deepcopy(layers_merged(layers))  # where set_path refuses a key below a value
    sets: dict[str, Any] = {}
    for item in overrides:
        key, value = parse_override(item)
        set_path(files, key, value)
        set_path(sets, key, value)
    layers = [*layers, sets]
    if migrate:
        layers = [renamed_fields_mapped(layer) for layer in layers]
    return validate_config(layers_merged(layers))


def parameters_merged(served: dict[str, Any], given: ItergrpoConfig) -> ItergrpoConfig:
    """A run's parameters (`given`, as Prefect validated them) on top of the config it was
    served with (`served`, the whole tree the form shows): the fields they set, as `--set`
    would. The UI form sends every section, filled in with `served`: there the fields set
    are the ones changed in the form, so a preset chosen there sets the fields it names
    that were left as shown."""
    sent = given.model_dump(mode="json", exclude_unset=True)
    if given.model_fields_set == set(ItergrpoConfig.model_fields):  # the form
        sent = _changed(served, sent)
    return validate_config(layers_merged([served, sent]))


def _changed(shown: dict[str, Any], sent: dict[str, Any]) -> dict[str, Any]:
    """The fields of `sent` whose values differ from `shown`'s."""
    out: dict[str, Any] = {}
    for key, value in sent.items():
        was = shown.get(key)
        if isinstance(value, dict) and isinstance(was, dict):
            inner = _changed(was, value)
            if inner:
                out[key] = inner
        elif key not in shown or value != was:
            out[key] = value
    return out


def validate_config(tree: dict[str, Any]) -> ItergrpoConfig:
    """Validate a config tree; errors name each field, the value and the rule."""
    try:
        return ItergrpoConfig.model_validate(tree)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            where = ".".join(str(p) for p in err["loc"]) or "(top level)"
            got = ""
            # a section's own rule: its whole input would only bury the message
            if "input" in err and err["type"] != "missing" and not isinstance(err["input"], dict):
                shown = repr(err["input"])
                got = f" (got {shown[:77] + '...' if len(shown) > 80 else shown})"
            lines.append(f"  {where}: {err['msg']}{_did_you_mean(err)}{got}")
        raise ConfigError("invalid config:\n" + "\n".join(lines)) from None


def _did_you_mean(err: ErrorDetails) -> str:
    """For an unknown key, the fields of its section it may have meant."""
    if err["type"] != "extra_forbidden" or not err["loc"]:
        return ""
    *section, key = (str(part) for part in err["loc"])
    close = close_fields(section, key)
    prefix = "".join(f"{part}." for part in section)
    return f"; did you mean {' or '.join(prefix + name for name in close)}?" if close else ""


def config_to_yaml(cfg: ItergrpoConfig) -> str:
    return yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False)


# Where the work runs, lives or is reported, not what it computes: a run may be resumed with
# these changed (tracking turned on at a resume logs the stages committed before it).
PLACEMENT_SECTIONS = ("cluster", "store", "tracking")


def stored_config_as_current(stored: dict[str, Any], current: ItergrpoConfig) -> dict[str, Any]:
    """A run's stored config in this version's form, for comparing with `current` on resume.

    Fields added since the run started get their defaults (a run from before a new section
    existed stays resumable), and the placement sections are taken from `current`.
    A stored config this version cannot read is returned unchanged (the comparison then
    names the differing keys).
    """
    try:
        migrated = stored_config_migrated(stored)
        upgraded = ItergrpoConfig.model_validate(migrated).model_dump(mode="json")
    except ValidationError:
        return stored
    now = current.model_dump(mode="json")
    return {**upgraded, **{name: now[name] for name in PLACEMENT_SECTIONS}}


# The run's length: no stage computes differently for more iterations after its own (label
# and train_rm read it only to number their log lines, "iteration 0 (1 of 3)").
ITERATIONS_KEY = ("run", "iterations")


def stored_config_for_rerun(stored: dict[str, Any], current: ItergrpoConfig) -> dict[str, Any]:
    """stored_config_as_current for the same run started again: a raised run.iterations is
    taken as stored, so a finished or stopped run continues with more iterations (`itergrpo
    resume RUN --set run.iterations=N`); a lowered one stays a difference, refused once a
    stage is committed (its rows would outlive the run's length). Not for forks: there the
    count still counts as read by every stage (flows/fork.py)."""
    upgraded = stored_config_as_current(stored, current)
    section, key = ITERATIONS_KEY
    run = upgraded.get(section)
    more = current.run.iterations
    if isinstance(run, dict) and isinstance(run.get(key), int) and more > run[key]:
        upgraded = {**upgraded, section: {**run, key: more}}
    return upgraded


def stored_config_migrated(stored: dict[str, Any]) -> dict[str, Any]:
    """A run's stored config (the whole dump) in this version's terms, so earlier runs stay
    resumable: renamed fields mapped (renamed_fields_mapped), and a behaviour added since
    under a new default set to what the run did, so a resumed run computes what it started
    computing (labelling.shared_prefixes: false)."""
    out = renamed_fields_mapped(stored)
    labelling = out.get("labelling")
    if isinstance(labelling, dict) and "shared_prefixes" not in labelling:
        out = {**out, "labelling": {**labelling, "shared_prefixes": False}}
    return out


def task_sections_of(tree: dict[str, Any]) -> dict[str, Any]:
    """A config tree whose task section's flat keys of earlier versions (task.min_steps,
    task.rg_task, task.path, ...) are moved into their task's section (task.arith.min_steps)."""
    task = tree.get("task")
    return {**tree, "task": with_task_sections(task)} if isinstance(task, dict) else tree


def renamed_fields_mapped(tree: dict[str, Any]) -> dict[str, Any]:
    """A config tree (whole or partial) with fields renamed since mapped to their new names:
    grpo.algo.supervision / adv_scaling -> adv_estimator; reward_models.init / init_path /
    prm_init -> reward_models.orm.source / prm.source; the flat task keys -> task.<name>.*."""
    out = task_sections_of(tree)
    algo = tree.get("grpo", {}).get("algo")
    if isinstance(algo, dict):
        out = {**out, "grpo": {**tree["grpo"], "algo": migrate_replaced_fields(algo)}}
    rms = tree.get("reward_models")
    if isinstance(rms, dict):
        out = {**out, "reward_models": migrate_replaced_rm_fields(rms)}
    return out
