"""The task section in its registry's shape (task: {name, <task>: {...}}) and in the flat shape
of earlier versions (task.min_steps, task.rg_task, task.path): both load and mean the same in
YAML, --set and stored run configs, so an old store resumes and an old config file runs."""

from __future__ import annotations

import functools
from pathlib import Path

import pytest
import yaml

from flows.config_files import (
    load_config,
    renamed_fields_mapped,
    stored_config_as_current,
    stored_config_migrated,
)
from flows.errors import ConfigError
from storage.errors import ConfigMismatchError
from storage.store import RunStore
from tests.flow_helpers import commit_a_stage

# The task section of a `micro` run's config.yaml as the version before the task registry
# stored it: every task's knobs side by side.
FLAT_MICRO_TASK = yaml.safe_load(
    """
name: arith
min_steps: 1
max_steps: 2
operand_max: 2
operators: +
distinct_test: false
math_kinds: [fraction_sum, radical_sum, midpoint]
math_max: 4
test_fraction: 0.2
rg_task: chain_sum
rg_kwargs: {}
path: null
test_path: null
data_format: auto
columns: {question: null, solution: null, answer: null}
file_reader: itergrpo
answer_format: auto
on_bad_rows: error
"""
)


def test_a_flat_yaml_config_loads_as_its_sectioned_form(tmp_path: Path) -> None:
    flat = tmp_path / "flat.yaml"
    flat.write_text(
        "base: micro\ntask:\n  name: math_style\n  math_max: 3\n  math_kinds: [midpoint]\n"
    )
    sectioned = tmp_path / "sectioned.yaml"
    sectioned.write_text(
        "base: micro\ntask:\n  name: math_style\n"
        "  math_style:\n    max_number: 3\n    kinds: [midpoint]\n"
    )
    cfg = load_config(flat)
    assert cfg == load_config(sectioned)
    assert cfg.task.math_style.model_dump() == {  # type: ignore[attr-defined]
        "kinds": ["midpoint"],
        "max_number": 3,
    }
    # a sectioned variant of a flat base: each file is read in its own shape before merging
    variant = tmp_path / "variant.yaml"
    variant.write_text(f"base: {flat}\ntask:\n  math_style:\n    max_number: 5\n")
    assert load_config(variant).task.math_style.max_number == 5  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("flat", "sectioned"),
    [
        ("task.min_steps=2", "task.arith.min_steps=2"),
        ("task.rg_kwargs={max_terms: 3}", "task.reasoning_gym.options={max_terms: 3}"),
        ("task.columns.question=prompt", "task.local_files.columns.question=prompt"),
    ],
)
def test_a_flat_set_on_a_sectioned_preset_means_its_section_field(
    flat: str, sectioned: str
) -> None:
    assert load_config("micro", [flat]) == load_config("micro", [sectioned])
    assert load_config("micro", [flat]) != load_config("micro")


def test_a_flat_set_keeps_the_rest_of_its_section() -> None:
    cfg = load_config(
        "micro",
        [
            "task.local_files.columns.solution=worked",
            "task.columns.question=prompt",
            "task.min_steps=2",
        ],
    )
    sections = cfg.task.model_dump()
    assert sections["local_files"]["columns"] == {
        "question": "prompt",
        "solution": "worked",
        "answer": None,
    }
    assert sections["arith"] == {**load_config("micro").task.model_dump()["arith"], "min_steps": 2}


def test_task_errors_name_the_sectioned_field_and_the_fix() -> None:
    with pytest.raises(ConfigError) as err:
        load_config("micro", ["task.min_steps=3"])  # micro's max_steps is 2
    assert "task.arith.min_steps (3) must be <= task.arith.max_steps (2)" in str(err.value)
    with pytest.raises(ConfigError, match=r"task\.local_files\.path is required when task\.name"):
        load_config("micro", ["task.name=local_files"])
    with pytest.raises(ConfigError, match=r"task\.arith\.operators must be a non-empty subset"):
        load_config("micro", ["task.arith.operators=/"])
    with pytest.raises(ConfigError, match=r"unknown task 'nope': choose one of \['arith'"):
        load_config("micro", ["task.name=nope"])
    with pytest.raises(ConfigError, match="task has no field 'min_stepz'"):
        load_config("micro", ["task.min_stepz=1"])
    with pytest.raises(ConfigError, match=r"task\.arith\.min_stepz"):
        load_config("micro", ["task.arith.min_stepz=1"])


def test_a_stored_flat_config_is_its_runs_sectioned_config(tmp_path: Path) -> None:
    """An earlier run's config.yaml upgrades to exactly this version's config of the same run,
    so a resume (or fork, or rerun) of an old store is not refused as a changed config."""
    current = load_config("micro", [f"store.root={tmp_path}"])
    stored = {**current.model_dump(mode="json"), "task": FLAT_MICRO_TASK}
    assert stored_config_as_current(stored, current) == current.model_dump(mode="json")
    # the flat keys fill the sections of the tasks of their time; a task added since (code
    # functions) has no flat keys, and its section is filled with its defaults when loaded
    newer = {"code_functions"}
    sections = {k: v for k, v in current.model_dump(mode="json")["task"].items() if k not in newer}
    assert stored_config_migrated(stored)["task"] == sections
    # the run's directory as the earlier version left it, with a committed stage
    commit_a_stage(RunStore(tmp_path), "r1", stored)
    upgrade = functools.partial(stored_config_as_current, current=current)
    with RunStore(tmp_path).open_run("r1", current.model_dump(mode="json"), upgrade_config=upgrade):
        pass
    changed = load_config("micro", [f"store.root={tmp_path}", "task.arith.operand_max=3"])
    upgrade = functools.partial(stored_config_as_current, current=changed)
    with (
        pytest.raises(ConfigMismatchError, match=r"task\.arith\.operand_max"),
        RunStore(tmp_path).open_run("r1", changed.model_dump(mode="json"), upgrade_config=upgrade),
    ):
        pass


def test_stored_flat_overrides_of_an_ablation_load_into_sections() -> None:
    cfg = load_config("micro", ["task.distinct_test=true"], migrate=True)
    assert cfg.task.arith.distinct_test  # type: ignore[attr-defined]
    assert renamed_fields_mapped({"task": {"rg_task": "gsm_symbolic"}}) == {
        "task": {"reasoning_gym": {"dataset": "gsm_symbolic"}}
    }


def test_flat_task_parameters_of_a_prefect_run_merge_into_their_sections(tmp_path: Path) -> None:
    """A deployment's or a UI run's parameters in the flat shape (an earlier deployment's
    defaults, a saved parameter set) change only the fields they name, in their sections."""
    from flows.prefect_flow import iterative_rl, served_config

    served = load_config("micro", [f"store.root={tmp_path}"])
    flat = {"task": {"min_steps": 2, "rg_task": "gsm_symbolic"}}
    given = iterative_rl.validate_parameters({"config": flat})["config"]
    merged = served_config(given, served.model_dump_json())
    arith = {**served.task.arith.model_dump(), "min_steps": 2}  # type: ignore[attr-defined]
    assert merged.task.arith.model_dump() == arith  # type: ignore[attr-defined]
    assert merged.task.reasoning_gym.dataset == "gsm_symbolic"  # type: ignore[attr-defined]
    assert merged.model_copy(update={"task": served.task}) == served
