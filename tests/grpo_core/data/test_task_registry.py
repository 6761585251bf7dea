"""Tasks by name: task.name's choices, each task's settings section, its required fields and
its own answer format come from the registry, and a task registered by a test is configured,
checked and built like a built-in one (docs/extending.md, "A new task")."""

from __future__ import annotations

import inspect
from pathlib import Path

import pytest
from pydantic import ValidationError

from grpo_core.data.tasks import TASKS, TaskConfig, make_task
from grpo_core.data.tasks.arith import ArithTask
from grpo_core.data.tasks.math_style import MathStyleTask
from tests.toy_task import PlusOneSettings, PlusOneTask, build, plus_one

__all__ = ["plus_one"]  # the fixture, used by name

# Every knob of the flat task section of earlier versions, each set off its default.
FLAT = {
    "name": "math_style",
    "min_steps": 1,
    "max_steps": 3,
    "operand_max": 5,
    "operators": "+*",
    "distinct_test": True,
    "math_kinds": ["midpoint"],
    "math_max": 6,
    "test_fraction": 0.3,
    "rg_task": "gsm_symbolic",
    "rg_kwargs": {"difficulty": 1},
    "path": "/data/train.jsonl",
    "test_path": "/data/test.jsonl",
    "data_format": "math",
    "columns": {"question": "prompt"},
    "file_reader": "datasets",
    "answer_format": "boxed",
    "on_bad_rows": "skip",
}
SECTIONED = {
    "name": "math_style",
    "test_fraction": 0.3,
    "answer_format": "boxed",
    "arith": {
        "min_steps": 1,
        "max_steps": 3,
        "operand_max": 5,
        "operators": "+*",
        "distinct_test": True,
    },
    "math_style": {"kinds": ["midpoint"], "max_number": 6},
    "reasoning_gym": {"dataset": "gsm_symbolic", "options": {"difficulty": 1}},
    # a task added after the flat shape: its section is its defaults
    "code_functions": {
        "kinds": ["linear", "square_plus", "larger_of", "remainder"],
        "max_number": 9,
    },
    "local_files": {
        "path": "/data/train.jsonl",
        "test_path": "/data/test.jsonl",
        "data_format": "math",
        "columns": {"question": "prompt", "solution": None, "answer": None},
        "file_reader": "datasets",
        "on_bad_rows": "drop",  # skip, its earlier name
    },
}


def test_the_choices_and_sections_are_the_registered_tasks() -> None:
    schema = TaskConfig.model_json_schema()
    name = schema["properties"]["name"]
    assert name["enum"] == TASKS.names()
    built_in = ["arith", "math_style", "reasoning_gym", "code_functions", "local_files"]
    assert TASKS.names() == built_in
    for task, spec in TASKS.items():
        assert spec.summary in name["description"]
        assert task in schema["properties"]  # its section, in the Prefect form too
    shared = ["name", "test_fraction", "answer_format"]
    assert list(TaskConfig().model_dump()) == [*shared, *TASKS.names()]


def test_the_flat_keys_of_earlier_versions_load_into_their_sections() -> None:
    assert TaskConfig.model_validate(FLAT).model_dump() == SECTIONED
    assert TaskConfig.model_validate(FLAT) == TaskConfig.model_validate(SECTIONED)
    flat_arith = {k: FLAT[k] for k in SECTIONED["arith"]}  # type: ignore[attr-defined]
    old, new = TaskConfig(**flat_arith), TaskConfig(arith=SECTIONED["arith"])
    assert make_task(old).problems("test", 20, seed=1) == make_task(new).problems(
        "test", 20, seed=1
    )


def test_each_task_is_built_from_its_own_section() -> None:
    task = make_task(TaskConfig.model_validate(SECTIONED))
    assert isinstance(task, MathStyleTask)
    assert (task.kinds, task.largest, task.test_fraction) == (("midpoint",), 6, 0.3)
    arith = make_task(
        TaskConfig.model_validate({**SECTIONED, "name": "arith", "answer_format": "auto"})
    )
    assert isinstance(arith, ArithTask)
    assert (arith.min_steps, arith.max_steps, arith.operand_max, arith.operators) == (1, 3, 5, "+*")


def test_a_flat_key_wins_over_its_section_as_a_later_set_does() -> None:
    cfg = TaskConfig.model_validate(
        {"arith": {"min_steps": 1, "max_steps": 3}, "max_steps": 5, "columns": {"answer": "a"}}
    )
    assert cfg.section().model_dump()["max_steps"] == 5
    assert cfg.section().model_dump()["min_steps"] == 1  # the rest of the section stays
    assert cfg.section("local_files").model_dump()["columns"]["answer"] == "a"


def test_a_task_declares_what_it_needs_and_its_own_answer_format() -> None:
    with pytest.raises(ValidationError, match=r"task\.local_files\.path is required"):
        TaskConfig(name="local_files")
    assert TaskConfig(name="local_files", local_files={"path": "x"}).section().model_dump()["path"]
    with pytest.raises(ValidationError, match=r"task arith states answers in the 'gsm8k'"):
        TaskConfig(name="arith", answer_format="boxed")
    assert TaskConfig(name="local_files", local_files={"path": "x"}, answer_format="boxed")


def test_a_registered_task_is_configured_checked_and_built(plus_one: str) -> None:
    assert TaskConfig.model_json_schema()["properties"]["name"]["enum"][-1] == plus_one
    cfg = TaskConfig.model_validate({"name": plus_one, plus_one: {"largest": 20}})
    assert cfg.model_dump()[plus_one] == {"largest": 20}
    assert TaskConfig(name=plus_one).model_dump()[plus_one] == {"largest": 50}  # its default
    task = make_task(cfg)
    assert isinstance(task, PlusOneTask) and task.largest == 20
    problems = task.problems("train", 30, seed=0)
    assert problems == task.problems("train", 30, seed=0)
    assert all(task.is_correct(p, p.solution or "") for p in problems)
    assert {p.question for p in problems}.isdisjoint(
        q.question for q in task.problems("test", 10, 0)
    )
    with pytest.raises(ValidationError, match=r"task\.plus_one\.largest: Input should be greater"):
        TaskConfig.model_validate({"name": plus_one, plus_one: {"largest": 1}})
    with pytest.raises(ValidationError, match=r"task plus_one states answers in the 'gsm8k'"):
        TaskConfig(name=plus_one, answer_format="boxed")


def test_an_unregistered_task_is_refused_naming_the_choices() -> None:
    assert "plus_one" not in TASKS  # the fixture unregistered it
    with pytest.raises(ValidationError, match=r"unknown task 'plus_one': choose one of \["):
        TaskConfig(name="plus_one")


def test_the_extending_page_shows_the_toy_task_as_tested() -> None:
    page = (Path(__file__).resolve().parents[3] / "docs" / "extending.md").read_text()
    for part in (PlusOneSettings, PlusOneTask, build):
        assert inspect.getsource(part) in page, part.__name__
