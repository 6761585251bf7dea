"""The math_style task: seeded LaTeX problems whose answers need the equivalence check, gold
solutions ending in a box, exact step labels; and the exact evaluator its step checker reads."""

from __future__ import annotations

import random
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from grpo_core.data.reasoning_steps import split_steps
from grpo_core.data.tasks import TaskConfig, make_task
from grpo_core.data.tasks.base import Problem, TaskDataError
from grpo_core.data.tasks.math_exprs import (
    evaluate,
    rational,
    square_free_split,
    surd,
    to_latex,
)
from grpo_core.data.tasks.math_style import KINDS, MathStyleTask

TASK = MathStyleTask()


def problem(question: str) -> Problem:
    solution = TASK.solution(question)
    return Problem("p", question, TASK.answer_format.extract(solution) or "", solution)


# ---- the exact evaluator ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("7", rational(7)),
        ("\\frac{3}{6}+\\frac{2}{6}", rational(Fraction(5, 6))),
        ("\\frac{1+4}{2}", rational(Fraction(5, 2))),
        ("2.5", rational(Fraction(5, 2))),
        ("5/2", rational(Fraction(5, 2))),
        ("\\sqrt{8}", surd({2: 2})),
        ("\\sqrt{8}+\\sqrt{2}", surd({2: 3})),
        ("2\\sqrt{2}-3\\sqrt{2}", surd({2: -1})),
        ("-\\sqrt{3}", surd({3: -1})),
        ("\\sqrt{3}\\cdot\\sqrt{3}", rational(3)),
        ("\\sqrt{6}\\cdot\\sqrt{2}", surd({3: 2})),
        ("\\sqrt{\\frac{1}{2}}", surd({2: Fraction(1, 2)})),
        ("1+\\sqrt{2}", surd({1: 1, 2: 1})),
        ("\\left(1+2\\right)\\cdot2", rational(6)),
        ("2 x", rational(6)),  # x = 3 below
        ("\\sqrt{2}-\\sqrt{2}", ()),
    ],
)
def test_evaluate_reads_the_subset_exactly(text: str, value: tuple) -> None:
    assert evaluate(text, {"x": rational(3)}) == value


@pytest.mark.parametrize(
    "text",
    ["", "=", "\\frac{1}{\\sqrt{2}}", "\\sqrt{\\sqrt{2}}", "\\sqrt{-4}", "1/0", "2+", "y", "\\pi"],
)
def test_evaluate_refuses_what_is_outside_the_subset(text: str) -> None:
    assert evaluate(text) is None


@given(st.integers(1, 10**6))
def test_square_free_split(n: int) -> None:
    outside, radicand = square_free_split(n)
    assert outside * outside * radicand == n
    assert all(radicand % (p * p) for p in range(2, int(radicand**0.5) + 1))


coefficients = st.fractions(min_value=-50, max_value=50, max_denominator=12)


@given(st.dictionaries(st.sampled_from([1, 2, 3, 5, 6, 7]), coefficients, max_size=3))
def test_latex_of_a_value_reads_back_as_it(terms: dict[int, Fraction]) -> None:
    value = surd(terms)
    assert evaluate(to_latex(value)) == value


@given(st.lists(st.tuples(st.integers(1, 9), st.integers(1, 9)), min_size=1, max_size=4))
def test_a_sum_of_fractions_agrees_with_fraction_arithmetic(pairs: list[tuple[int, int]]) -> None:
    text = "+".join(f"\\frac{{{a}}}{{{b}}}" for a, b in pairs)
    assert evaluate(text) == rational(sum(Fraction(a, b) for a, b in pairs))


# ---- problems and gold solutions ---------------------------------------------------------------


def test_problems_are_seeded_and_splits_do_not_overlap() -> None:
    assert TASK.problems("train", 60, seed=3) == TASK.problems("train", 60, seed=3)
    assert TASK.problems("train", 60, seed=3) != TASK.problems("train", 60, seed=4)
    train = {p.question for p in TASK.problems("train", 2000, seed=0)}
    test = {p.question for p in TASK.problems("test", 500, seed=1)}
    assert not train & test
    kinds = [p.meta["kind"] for p in TASK.problems("train", 300, seed=0)]
    assert {kinds.count(k) for k in KINDS} <= set(range(70, 131))  # each kind about 1/3


def test_gold_solutions_are_right_step_by_step_and_end_in_a_box() -> None:
    fmt = TASK.answer_format
    for p in TASK.problems("train", 150, seed=0) + TASK.problems("test", 150, seed=0):
        assert p.solution is not None
        assert split_steps(p.solution)[-1] == f"\\boxed{{{p.answer}}}"
        assert fmt.extract(p.solution) == p.answer and fmt.ends_with_answer(p.solution) == 1.0
        assert fmt.check_gold(p.answer) is None  # math-verify reads every gold answer
        assert TASK.is_correct(p, p.solution)
        assert all(TASK.step_labels(p, p.solution) or [False])


@pytest.mark.parametrize(
    ("question", "solution"),
    [
        (
            "\\frac{1}{4}+\\frac{2}{3}",
            "=\\frac{3}{12}+\\frac{8}{12}\n=\\frac{11}{12}\n\\boxed{\\frac{11}{12}}",
        ),
        ("\\frac{1}{4}+\\frac{3}{4}", "=\\frac{4}{4}\n=1\n\\boxed{1}"),
        (
            "\\frac{1}{2}+\\frac{1}{6}",
            "=\\frac{3}{6}+\\frac{1}{6}\n=\\frac{4}{6}\n=\\frac{2}{3}\n\\boxed{\\frac{2}{3}}",
        ),
        ("\\sqrt{8}+\\sqrt{2}", "=2\\sqrt{2}+\\sqrt{2}\n=3\\sqrt{2}\n\\boxed{3\\sqrt{2}}"),
        ("\\sqrt{3}+\\sqrt{3}", "=2\\sqrt{3}\n\\boxed{2\\sqrt{3}}"),
        ("\\sqrt{18}-\\sqrt{8}", "=3\\sqrt{2}-2\\sqrt{2}\n=\\sqrt{2}\n\\boxed{\\sqrt{2}}"),
        (
            "midpoint of (1,2) and (4,2)",
            "x=\\frac{1+4}{2}=\\frac{5}{2}\ny=\\frac{2+2}{2}=2\n\\boxed{(\\frac{5}{2}, 2)}",
        ),
    ],
)
def test_gold_solutions_by_hand(question: str, solution: str) -> None:
    assert TASK.solution(question) == solution


def test_corrupt_injects_one_wrong_step_and_continues_from_it() -> None:
    rng = random.Random(0)
    for p in TASK.problems("train", 100, seed=0):
        bad = TASK.corrupt(p, rng)
        labels = TASK.step_labels(p, bad)
        assert labels is not None and len(labels) == len(split_steps(bad))
        assert not TASK.is_correct(p, bad) and not labels[-1]
        if p.meta["kind"] == "midpoint":  # the other coordinate's line stays right
            assert labels[:-1].count(False) == 1
        else:  # right up to the injected step, wrong from it on
            right = labels.index(False)
            assert labels == [True] * right + [False] * (len(labels) - right)
    q = "\\frac{1}{4}+\\frac{2}{3}"
    assert TASK.solution(q, wrong_step=1, delta=1) == (
        "=\\frac{3}{12}+\\frac{8}{12}\n=\\frac{12}{12}\n=1\n\\boxed{1}"
    )
    assert TASK.solution("midpoint of (1,2) and (4,2)", wrong_step=0, delta=1) == (
        "x=\\frac{1+4}{2}=3\ny=\\frac{2+2}{2}=2\n\\boxed{(3, 2)}"
    )


def test_a_split_without_questions_is_a_task_data_error() -> None:
    single = MathStyleTask(kinds=("fraction_sum",), largest=2)  # only 1/2 + 1/2 exists
    sizes = {}
    for split in ("train", "test"):
        try:
            sizes[split] = len(single.problems(split, 3, seed=0))
        except TaskDataError as err:
            assert "task.math_style.max_number" in str(err)
            sizes[split] = 0
    assert sorted(sizes.values()) == [0, 3]


# ---- answers need the equivalence --------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "output", "correct"),
    [
        ("\\frac{1}{2}+\\frac{1}{3}", "\\boxed{5/6}", True),
        ("\\frac{1}{2}+\\frac{1}{3}", "\\boxed{\\frac{10}{12}}", True),
        ("\\frac{1}{2}+\\frac{1}{3}", "\\boxed{\\frac56}", True),
        ("\\frac{1}{2}+\\frac{1}{6}", "=\\frac{4}{6}\n\\boxed{\\frac{4}{6}}", True),  # unreduced
        ("\\frac{1}{4}+\\frac{3}{4}", "\\boxed{\\frac{4}{4}}", True),
        ("\\frac{1}{2}+\\frac{1}{6}", "\\boxed{4/6}", True),
        ("\\frac{1}{2}+\\frac{1}{6}", "\\boxed{0.6666667}", True),
        ("\\frac{1}{2}+\\frac{1}{3}", "\\boxed{\\frac{2}{5}}", False),
        ("\\sqrt{8}+\\sqrt{2}", "\\boxed{\\sqrt{18}}", True),
        ("\\sqrt{8}+\\sqrt{2}", "\\boxed{3\\sqrt2}", True),
        ("\\sqrt{8}+\\sqrt{2}", "\\boxed{3 \\sqrt{2}}", True),
        ("\\sqrt{8}+\\sqrt{2}", "\\boxed{2\\sqrt{3}}", False),
        ("midpoint of (1,2) and (4,2)", "\\boxed{(2.5, 2)}", True),
        ("midpoint of (1,2) and (4,2)", "\\boxed{(5/2,2)}", True),
        ("midpoint of (1,2) and (4,2)", "\\boxed{\\left(\\frac{5}{2},2\\right)}", True),
        ("midpoint of (1,2) and (4,2)", "\\boxed{(2, \\frac{5}{2})}", False),  # swapped
        ("midpoint of (1,2) and (4,2)", "(\\frac{5}{2}, 2)", False),  # no box: no answer
    ],
)
def test_equal_answers_written_otherwise_are_correct(
    question: str, output: str, correct: bool
) -> None:
    p = problem(question)
    assert (TASK.answer_format.extract(output) or "") != p.answer  # a string match would fail
    assert TASK.is_correct(p, output) is correct


# ---- exact step labels -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("question", "completion", "labels"),
    [
        # a slip in the common denominator, carried on
        (
            "\\frac{1}{2}+\\frac{1}{3}",
            "=\\frac{2}{6}+\\frac{2}{6}\n=\\frac{4}{6}\n\\boxed{\\frac{2}{3}}",
            [False, False, False],
        ),
        # the expansion skipped, the answer left unreduced: every step true
        ("\\frac{1}{2}+\\frac{1}{6}", "=\\frac{4}{6}\n\\boxed{\\frac{4}{6}}", [True, True]),
        # a line that is not mathematics in this subset, then a recovery
        (
            "\\frac{1}{2}+\\frac{1}{3}",
            "so add\n= 5/6\n\\boxed{\\frac{5}{6}}",
            [False, True, True],
        ),
        # a true equation, but not the question's value
        ("\\sqrt{8}+\\sqrt{2}", "\\sqrt{8}=2\\sqrt{2}\n=3\\sqrt{2}", [False, True]),
        (
            "\\sqrt{8}+\\sqrt{2}",
            "=2\\sqrt{2}+\\sqrt{2}\n=2\\sqrt{4}\n\\boxed{4}",
            [True, False, False],
        ),
        (
            "midpoint of (1,2) and (4,2)",
            "x=\\frac{1+4}{2}=\\frac{5}{2}\ny=\\frac{2+2}{2}=3\n\\boxed{(\\frac{5}{2}, 3)}",
            [True, False, False],
        ),
        # y before x, decimals, an x-line that uses y's true value
        (
            "midpoint of (1,2) and (4,2)",
            "y=2\nx=2.5\nx=y+0.5\n\\boxed{(2.5, 2)}",
            [True, True, True, True],
        ),
        ("midpoint of (1,2) and (4,2)", "\\frac{5}{2}\nz=2", [False, False]),
    ],
)
def test_step_labels_by_hand(question: str, completion: str, labels: list[bool]) -> None:
    p = problem(question)
    assert TASK.step_labels(p, completion) == labels
    assert len(labels) == len(split_steps(completion))


# ---- the config --------------------------------------------------------------------------------


def test_task_config_builds_math_style_with_its_own_answer_format() -> None:
    cfg = TaskConfig(name="math_style", math_style={"kinds": ["radical_sum"], "max_number": 3})
    assert cfg.answer_format == "auto"  # the task's own
    task = make_task(cfg)
    assert isinstance(task, MathStyleTask) and task.answer_format.name == "boxed"
    assert {p.meta["kind"] for p in task.problems("train", 50, 0)} == {"radical_sum"}
    assert TaskConfig(name="math_style", answer_format="boxed").answer_format == "boxed"
    assert make_task(TaskConfig()).answer_format.name == "gsm8k"
    with pytest.raises(ValidationError, match=r"task\.answer_format: auto or boxed"):
        TaskConfig(name="math_style", answer_format="gsm8k")
    with pytest.raises(ValidationError, match=r"task\.answer_format: auto or gsm8k"):
        TaskConfig(name="arith", answer_format="boxed")
    with pytest.raises(ValidationError, match=r"math_style\.kinds"):
        TaskConfig(name="math_style", math_style={"kinds": ["integrals"]})
    with pytest.raises(ValidationError, match=r"math_style\.max_number"):
        TaskConfig(name="math_style", math_style={"max_number": 1})
