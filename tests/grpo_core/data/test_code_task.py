"""The code task and its answer format: problems whose gold answer is a set of tests, and the
verifier that runs an output's last ```python block against them in the sandbox."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from flows.config_files import load_config
from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.code_answers import (
    canonical_program,
    check_tests,
    ends_with_program,
    last_python_block,
)
from grpo_core.data.tasks import make_task
from grpo_core.data.tasks.base import TaskDataError
from grpo_core.data.tasks.code_functions import CodeFunctionsTask

PYTHON_TESTS = ANSWER_FORMATS["python_tests"]
TESTS = "assert f(0) == 2\nassert f(2) == 8"


def program(body: str) -> str:
    return f"Let me write it.\n```python\ndef f(x):\n    {body}\n```"


@pytest.mark.parametrize(
    ("body", "right"),
    [
        ("return 3 * x + 2", True),  # passes every test
        ("return 3 * x", False),  # fails one
        ("return 1 / 0", False),  # crashes
        ("while True:\n        pass", False),  # never ends: stopped by the sandbox
        ("import os\n    os.system('true')\n    return 3 * x + 2", False),  # refused
    ],
)
def test_an_output_is_right_when_its_program_passes_the_tests(body: str, right: bool) -> None:
    assert PYTHON_TESTS.is_correct(TESTS, program(body)) is right


def test_the_last_closed_block_is_the_answer() -> None:
    text = (
        "```python\ndef f(x):\n    return 0\n```\nbetter:\n```python\ndef f(x):\n    return 1\n```"
    )
    assert last_python_block(text) == "def f(x):\n    return 1\n"
    assert last_python_block("```python\ndef f(x): return 1") is None  # never closed
    assert last_python_block("no code") is None
    assert not PYTHON_TESTS.is_correct(TESTS, "the answer is 3x + 2")


def test_format_reward_wants_the_program_last() -> None:
    assert ends_with_program(program("return 1")) == 1.0
    assert ends_with_program(program("return 1") + "\nDone.") == 0.0
    assert ends_with_program("```python\n```") == 0.0


def test_votes_group_programs_that_differ_in_comments_and_blank_lines() -> None:
    a = "def f(x):\n    return x  # same\n\n"
    b = "def f(x):\n\n    return x\n"
    assert canonical_program(a) == canonical_program(b) == "def f(x):\n    return x"


def test_gold_tests_must_compile_and_assert() -> None:
    assert check_tests(TESTS) is None
    assert "not valid Python" in (check_tests("assert f(0) ==") or "")
    assert "no assert" in (check_tests("f(0)") or "")


def test_problems_carry_tests_their_gold_solution_passes() -> None:
    task = CodeFunctionsTask(largest=4)
    problems = task.problems("train", 6, seed=3)
    assert problems == task.problems("train", 6, seed=3)  # seeded
    assert {p.question for p in problems} & {
        p.question for p in task.problems("test", 50, 0)
    } == set()
    for p in problems:
        assert p.answer.count("assert f(") == 6
        assert task.is_correct(p, p.solution or "")


def test_a_question_and_its_tests_by_hand() -> None:
    task = CodeFunctionsTask(kinds=("linear",), largest=3, test_fraction=0.0)
    problem = next(
        p for p in task.problems("train", 50, 0) if p.question.endswith("3 times x plus 2.")
    )
    assert problem.answer.splitlines() == [
        "assert f(-3) == -7",
        "assert f(-1) == -1",
        "assert f(0) == 2",
        "assert f(2) == 8",
        "assert f(5) == 17",
        "assert f(11) == 35",
    ]


def test_the_task_is_chosen_by_name_in_a_config() -> None:
    cfg = load_config("micro", ["task.name=code_functions", "task.code_functions.max_number=5"])
    assert cfg.task.name == "code_functions"


def test_a_local_file_of_code_problems_is_read_checked_and_verified(tmp_path: Path) -> None:
    good = {
        "question": "Write f(s) returning s reversed.",
        "tests": "assert f('ab') == 'ba'\nassert f('') == ''",
        "solution": "```python\ndef f(s):\n    return s[::-1]\n```",
    }
    bad = {**good, "question": "Write f(x) returning x doubled.", "tests": "assert f(2) =="}
    data = tmp_path / "code.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in (good, bad)))
    sets = [f"task.local_files.path={data}", f"task.local_files.test_path={data}"]
    cfg = load_config("micro", ["task.name=local_files", *sets])
    with pytest.raises(TaskDataError, match=r"code.jsonl:2: .*not valid Python"):
        make_task(cfg.task)
    sets.append("task.local_files.on_bad_rows=drop")
    cfg = load_config("micro", ["task.name=local_files", *sets])
    task = make_task(cfg.task)
    assert task.answer_format.name == "python_tests"
    (problem,) = {p.question: p for p in task.problems("train", 3, 0)}.values()
    assert task.is_correct(problem, problem.solution or "")
    assert not task.is_correct(problem, program("return s"))
