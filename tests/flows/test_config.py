"""The run config: presets validate, bad values name the field and the rule, overrides typed."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import yaml

from flows.config import ItergrpoConfig
from flows.config_files import (
    CONFIG_DIR,
    ConfigError,
    config_to_yaml,
    load_config,
    parameters_merged,
    parse_override,
    stored_config_as_current,
    stored_config_migrated,
    validate_config,
)

PRESETS = sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def test_required_presets_exist() -> None:
    assert {"demo", "micro", "smollm2", "paper"} <= set(PRESETS)


@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_validates_and_round_trips_through_yaml(name: str, tmp_path: Path) -> None:
    cfg = load_config(name)
    path = tmp_path / "cfg.yaml"
    path.write_text(config_to_yaml(cfg))
    assert load_config(path) == cfg


def test_overrides_keep_yaml_types() -> None:
    assert parse_override("grpo.steps=20") == ("grpo.steps", 20)
    assert parse_override("grpo.algo.lr=1e-5") == ("grpo.algo.lr", 1e-5)
    assert parse_override("run.warm_start=false") == ("run.warm_start", False)
    assert parse_override("evaluation.ks=[1, 4]") == ("evaluation.ks", [1, 4])
    # A quoted number stays a string (a token string); unquoted YAML 1.1 '1e-5' is a number.
    assert parse_override("reward_models.prm.tokens.tag='2'") == (
        "reward_models.prm.tokens.tag",
        "2",
    )
    assert parse_override('x="1e-5"') == ("x", "1e-5")
    cfg = load_config("micro", ["grpo.steps=7", "grpo.algo.beta=0"])
    assert cfg.grpo.steps == 7 and cfg.grpo.algo.beta == 0.0


@pytest.mark.parametrize(
    ("override", "field", "rule"),
    [
        ("grpo.group_size=1", "grpo.group_size", "greater than or equal to 2"),
        ("rollout.temperature=-1", "rollout.temperature", "greater than or equal to 0"),
        ("run.device=tpu", "run.device", "'auto', 'cpu' or 'cuda'"),
        ("reward_models.replay_ratio=1.0", "reward_models.replay_ratio", "less than 1"),
        ("grpo.stepz=3", "grpo.stepz", "Extra inputs are not permitted"),
    ],
)
def test_bad_values_name_the_field_and_the_rule(override: str, field: str, rule: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", [override])
    assert field in str(err.value) and rule in str(err.value)


def test_cross_field_rules_say_how_to_fix() -> None:
    with pytest.raises(ConfigError, match="use_orm = true"):
        load_config("micro", ["reward_models.use_orm=false", "grpo.rewards.orm=1.0"])
    with pytest.raises(ConfigError, match="use_prm = true"):
        load_config("micro", ["reward_models.use_prm=false", "grpo.rewards.prm=1.0"])


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (
            ["reward_models.use_prm=false", "grpo.algo.adv_estimator=grpo_process"],
            ["adv_estimator = grpo_process", "use_prm: true"],
        ),
        (
            ["reward_models.use_prm=false", "grpo.rewards.prm=0.5"],
            ["grpo.rewards.prm > 0", "use_prm: true"],
        ),
        (
            ["reward_models.use_orm=false", "grpo.rewards.orm=0.5"],
            ["grpo.rewards.orm > 0", "use_orm: true"],
        ),
        (
            ["grpo.rewards.verifier=0", "grpo.rewards.orm=0"],
            ["all 0", "every GRPO advantage"],
        ),
    ],
)
def test_impossible_combinations_are_refused_at_load_naming_fields_and_fix(
    overrides: list[str], names: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", overrides)
    for name in names:
        assert name in str(err.value)


def test_possible_combinations_load() -> None:
    # Process supervision with a PRM; rewards from the PRM's outcome score alone; an estimator
    # that needs no reward weights (RFT reads the verifier's correctness).
    load_config("micro", ["grpo.algo.adv_estimator=grpo_process", "grpo.rewards.orm=0"])
    load_config("micro", ["grpo.rewards.verifier=0", "grpo.rewards.orm=0", "grpo.rewards.prm=1"])
    cfg = load_config(
        "micro",
        [
            *("grpo.rewards.verifier=0", "grpo.rewards.orm=0"),
            *("grpo.algo.adv_estimator=rft", "grpo.data_source=policy_0"),
        ],
    )
    assert cfg.grpo.algo.adv_estimator == "rft" and not cfg.grpo.algo.process_supervision


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["grpo.algo.supervision=process"], "adv_estimator: grpo_process"),
        (["grpo.algo.adv_scaling=none"], "adv_estimator: dr_grpo"),
        (["grpo.algo.supervision=outcome", "grpo.algo.adv_scaling=group_std"], "grpo_outcome"),
    ],
)
def test_replaced_estimator_fields_are_refused_naming_the_new_one(old: list[str], new: str) -> None:
    with pytest.raises(ConfigError, match=r"replaced by grpo\.algo\.adv_estimator") as err:
        load_config("micro", old)
    assert new in str(err.value)


def test_a_stored_config_of_an_earlier_version_is_migrated_for_resume() -> None:
    current = load_config("micro", ["grpo.algo.adv_estimator=grpo_process"])
    stored = current.model_dump(mode="json")
    algo = {k: v for k, v in stored["grpo"]["algo"].items() if k != "adv_estimator"}
    stored["grpo"]["algo"] = {**algo, "supervision": "process", "adv_scaling": "group_std"}
    assert stored_config_as_current(stored, current) == current.model_dump(mode="json")
    earlier_outcome = {
        **stored,
        "grpo": {**stored["grpo"], "algo": {**algo, "adv_scaling": "none"}},
    }
    assert stored_config_migrated(earlier_outcome)["grpo"]["algo"]["adv_estimator"] == "dr_grpo"


def test_malformed_input_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        parse_override("grpo.steps")
    with pytest.raises(ConfigError, match="unknown preset 'nope'"):
        load_config("nope")
    with pytest.raises(ConfigError, match=r"config file not found: .*missing\.yaml"):
        load_config(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a list\n")
    with pytest.raises(ConfigError, match="mapping of sections"):
        load_config(bad)
    with pytest.raises(ConfigError, match="is a value, not a section"):
        load_config("micro", ["run.seed=1", "run.seed.x=2"])


def test_long_values_are_shortened_in_errors() -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", [f"run.run_id={'x' * 500}", "run.seed=-1"])
    assert "run.seed" in str(err.value) and len(str(err.value)) < 600


def test_defaults_are_the_documented_form() -> None:
    """Every field carries a description: the Prefect UI shows it as the form's help text."""
    missing = []

    def walk(model: type, prefix: str) -> None:
        for name, info in model.model_fields.items():  # type: ignore[attr-defined]
            if not info.description:
                missing.append(prefix + name)
            ann = info.annotation
            if isinstance(ann, type) and hasattr(ann, "model_fields"):
                walk(ann, f"{prefix}{name}.")

    walk(ItergrpoConfig, "")
    # Section fields are documented by their class docstring instead.
    sections = set(ItergrpoConfig.model_fields)
    assert [m for m in missing if m not in sections] == []


def _open_and_close(store_root: Path, cfg: ItergrpoConfig) -> None:
    from storage.store import RunStore

    upgrade = functools.partial(stored_config_as_current, current=cfg)
    store = RunStore(store_root)
    with store.open_run("r1", cfg.model_dump(mode="json"), upgrade_config=upgrade):
        pass


def test_resume_accepts_a_run_started_before_new_sections_and_a_moved_cluster(
    tmp_path: Path,
) -> None:
    from storage.errors import ConfigMismatchError
    from storage.store import RunStore
    from tests.flow_helpers import commit_a_stage

    cfg = load_config("micro", [f"store.root={tmp_path}"])
    # the run as an older version stored it: no `cluster` or `engines` section yet
    older = cfg.model_dump(mode="json")
    del older["cluster"], older["engines"]
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(older, sort_keys=False))
    _open_and_close(tmp_path, cfg)  # same run: accepted, recorded in the current form
    assert yaml.safe_load((run_dir / "config.yaml").read_text()) == cfg.model_dump(mode="json")
    assert len(list(run_dir.glob("config.*.yaml"))) == 1  # the older file is kept
    # where the work runs may change between attempts ...
    _open_and_close(tmp_path, load_config("micro", [f"store.root={tmp_path}", "cluster.shards=4"]))
    # ... what it computes may not, once a stage is committed
    commit_a_stage(RunStore(tmp_path), "r1", cfg.model_dump(mode="json"))
    with pytest.raises(ConfigMismatchError, match=r"run\.iterations"):
        _open_and_close(
            tmp_path, load_config("micro", [f"store.root={tmp_path}", "run.iterations=1"])
        )


def test_a_preset_can_name_a_base_and_state_only_what_differs(tmp_path: Path) -> None:
    variant = tmp_path / "variant.yaml"
    variant.write_text("base: micro\ngrpo:\n  rewards:\n    orm: 0.25\n")
    cfg, micro = load_config(variant), load_config("micro")
    assert cfg.grpo.rewards.orm == 0.25
    assert cfg.grpo.rewards.verifier == micro.grpo.rewards.verifier  # merged, not replaced
    assert cfg.model_copy(update={"grpo": micro.grpo}) == micro
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"base: {loop}\n")
    with pytest.raises(ConfigError, match="cycle"):
        load_config(loop)


@pytest.mark.parametrize(
    ("preset", "source", "estimator", "beta"),
    [
        ("sft", "gold", "sft", 0.0),
        ("rft", "policy_0", "rft", 0.0),
        ("online_rft", "online", "online_rft", 0.0),
        ("grpo_os", "online", "grpo_outcome", 0.04),
        ("grpo_ps", "online", "grpo_process", 0.04),
        ("dr_grpo", "online", "dr_grpo", 0.04),
        ("ppo", "online", "ppo", 0.0),  # PPO's KL penalty is in the reward, not the loss
    ],
)
def test_presets_set_the_unified_paradigm_from_set_yaml_and_the_form(
    tmp_path: Path, preset: str, source: str, estimator: str, beta: float
) -> None:
    yaml_file = tmp_path / "c.yaml"
    yaml_file.write_text(f"base: micro\ngrpo:\n  preset: {preset}\n")
    served = load_config("micro").model_dump(mode="json")
    form = load_config("micro").model_dump(mode="json")  # the UI form sends every field
    form["grpo"]["preset"] = preset
    for cfg in (load_config("micro", [f"grpo.preset={preset}"]), load_config(yaml_file)):
        g = cfg.grpo
        assert (g.preset, g.data_source, g.algo.adv_estimator, g.algo.beta) == (
            preset,
            source,
            estimator,
            beta,
        )
    assert parameters_merged(served, validate_config(form)).grpo.data_source == source


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (
            ["grpo.preset=ppo", "grpo.algo.ppo.critic_init=orm", "reward_models.use_orm=false"],
            ["grpo.algo.ppo.critic_init = orm", "use_orm: true", "critic_init: policy"],
        ),
        (["grpo.preset=ppo", "grpo.algo.ppo.lam=1.5"], ["grpo.algo.ppo.lam", "1"]),
        (["grpo.preset=ppo", "grpo.algo.ppo.kl_ctl=pid"], ["grpo.algo.ppo.kl_ctl", "adaptive"]),
        (["grpo.preset=ppo", "grpo.algo.ppo.vf_clip=0"], ["grpo.algo.ppo.vf_clip"]),
    ],
)
def test_bad_ppo_settings_are_refused_naming_the_field(
    overrides: list[str], names: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", [*overrides, "grpo.rewards.orm=0"])
    for name in names:
        assert name in str(err.value)


def test_the_ppo_preset_reads_the_critic_and_runs_the_reference_for_its_kl_penalty() -> None:
    algo = load_config("micro", ["grpo.preset=ppo"]).grpo.algo
    assert algo.estimator.needs_values and algo.beta == 0.0 and algo.needs_reference
    no_kl = load_config("micro", ["grpo.preset=ppo", "grpo.algo.ppo.kl_coef=0"]).grpo.algo
    assert not no_kl.needs_reference
    assert not load_config("micro", ["grpo.preset=dapo"]).grpo.algo.needs_reference


def test_a_field_given_another_value_than_its_default_wins_over_the_preset() -> None:
    cfg = load_config("micro", ["grpo.preset=dapo", "grpo.algo.eps_high=0.3"])
    assert cfg.grpo.algo.eps_high == 0.3 and cfg.grpo.algo.loss_agg == "token-mean"


@pytest.mark.parametrize(
    ("overrides", "names"),
    [
        (["grpo.data_source=gold"], ["data_source = gold", "adv_estimator: sft"]),
        (["grpo.algo.adv_estimator=rft"], ["data_source policy_0", "grpo.preset: online_rft"]),
        (["grpo.preset=sft", "grpo.data_source=policy_0"], ["sft trains on data_source gold"]),
        (
            ["grpo.preset=sft", "grpo.algo.use_sampling_logprobs_as_old=true"],
            ["no sampling log-probs"],
        ),
        (["grpo.preset=a2c"], ["grpo.preset", "'sft'", "'grpo_ps'", "'ppo'"]),
        (["grpo.algo.adv_estimator=ppo", "grpo.data_source=policy_0"], ["ppo trains on"]),
    ],
)
def test_a_data_source_the_estimator_cannot_use_is_refused(
    overrides: list[str], names: list[str]
) -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", overrides)
    for name in names:
        assert name in str(err.value)


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (["reward_models.prm_init=orm"], "orm: {source: policy}, prm: {source: orm}"),
        (
            ["reward_models.init=path", "reward_models.init_path=/models/rm"],
            "orm: {source: /models/rm}, prm: {source: /models/rm}",
        ),
    ],
)
def test_replaced_rm_init_fields_are_refused_naming_the_sources(old: list[str], new: str) -> None:
    with pytest.raises(ConfigError, match=r"replaced by reward_models\.orm\.source") as err:
        load_config("micro", old)
    assert new in str(err.value)


def test_a_stored_config_with_rm_init_fields_is_migrated_for_resume() -> None:
    current = load_config(
        "micro",
        ["reward_models.orm.source=/models/rm", "reward_models.prm.source=orm"],
    )
    stored = current.model_dump(mode="json")
    rms = {k: v for k, v in stored["reward_models"].items() if k not in ("orm", "prm")}
    stored["reward_models"] = {**rms, "init": "path", "init_path": "/models/rm", "prm_init": "orm"}
    assert stored_config_as_current(stored, current) == current.model_dump(mode="json")
    stored["reward_models"] = {**rms, "init": "policy", "init_path": None, "prm_init": "backbone"}
    migrated = stored_config_migrated(stored)["reward_models"]
    assert (migrated["orm"], migrated["prm"]) == ({"source": "policy"}, {"source": "policy"})


def test_a_stored_ablation_arm_that_set_prm_init_loads_migrated() -> None:
    # The default suite's arms said reward_models.prm_init=backbone before the RMs had sources;
    # its base (the demo) now says prm.source: orm, which the old override must replace.
    old_arm = ["reward_models.use_prm=false", "reward_models.prm_init=backbone"]
    with pytest.raises(ConfigError, match="prm_init"):
        load_config("demo-ablate", old_arm)
    cfg = load_config("demo-ablate", old_arm, migrate=True)
    assert cfg.reward_models.prm.source == "policy" and not cfg.reward_models.use_prm
    assert load_config("demo-ablate").reward_models.prm.source == "orm"


def test_a_run_stored_before_shared_prefixes_resumes_labelling_each_copy() -> None:
    current = load_config("demo")
    assert current.labelling.shared_prefixes
    stored = current.model_dump(mode="json")
    del stored["labelling"]["shared_prefixes"]
    assert stored_config_migrated(stored)["labelling"]["shared_prefixes"] is False
    as_current = stored_config_as_current(stored, current)
    assert as_current["labelling"]["shared_prefixes"] is False  # so a changed default shows
    # a suite's overrides read back from the store are a partial tree: the preset's default
    assert load_config(
        "demo", ["labelling.n_completions=4"], migrate=True
    ).labelling.shared_prefixes
