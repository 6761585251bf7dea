"""Built-in MATH-style task: seeded fraction sums, radical sums and midpoints whose answers are
LaTeX that only an equivalence check judges fairly (`\\frac{5}{6}` = `10/12`, `3\\sqrt{2}` =
`\\sqrt{18}`, `(\\frac{5}{2}, 2)` = `(2.5, 2)`), with one-step-per-line solutions ending in a
`\\boxed{}` line, and every step checked exactly.

    \\frac{1}{2}+\\frac{1}{3}        \\sqrt{8}+\\sqrt{2}        midpoint of (1,2) and (4,2)
    =\\frac{3}{6}+\\frac{2}{6}       =2\\sqrt{2}+\\sqrt{2}      x=\\frac{1+4}{2}=\\frac{5}{2}
    =\\frac{5}{6}                   =3\\sqrt{2}               y=\\frac{2+2}{2}=2
    \\boxed{\\frac{5}{6}}            \\boxed{3\\sqrt{2}}        \\boxed{(\\frac{5}{2}, 2)}
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable
from fractions import Fraction
from functools import cache
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from grpo_core.data.answer_formats import ANSWER_FORMATS, last_boxed
from grpo_core.data.reasoning_steps import split_steps
from grpo_core.data.tasks.base import Problem, Split, TaskCommon, TaskDataError, TaskSpec
from grpo_core.data.tasks.math_exprs import Surd, evaluate, rational, surd, to_latex
from grpo_core.data.tasks.splits import split_of

MathKind = Literal["fraction_sum", "radical_sum", "midpoint"]
KINDS: tuple[MathKind, ...] = get_args(MathKind)
RADICANDS = (2, 3, 5)  # radical sums combine like roots of these
STEP_DELTAS = (1, 2, 3)  # how far an injected wrong step is off

_FRACTION_SUM = re.compile(r"^\\frac\{(\d+)\}\{(\d+)\}\+\\frac\{(\d+)\}\{(\d+)\}$")
_RADICAL_SUM = re.compile(r"^\\sqrt\{(\d+)\}([+-])\\sqrt\{(\d+)\}$")
_MIDPOINT = re.compile(r"^midpoint of \((\d+),(\d+)\) and \((\d+),(\d+)\)$")


def _frac(numerator: int, denominator: int) -> str:
    return to_latex(rational(Fraction(numerator, denominator)))


def _root_term(coefficient: int, radicand: int) -> str:
    return to_latex(surd({radicand: coefficient}))


def _root_parts(n: int) -> tuple[int, int]:
    """(a, k) with n = a^2 k, k one of RADICANDS (questions are built that way)."""
    for k in RADICANDS:
        a = math.isqrt(n // k)
        if a * a * k == n:
            return a, k
    raise ValueError(f"sqrt({n}) is not a^2 times one of {RADICANDS}")


def _fraction_sum_lines(nums: tuple[int, ...], wrong: int | None, delta: int) -> list[str]:
    """Common denominator (when the two differ), the sum, its lowest terms (when it reduces)."""
    a, b, c, d = nums
    common = math.lcm(b, d)
    left, right = a * common // b, c * common // d
    lines: list[str] = []
    if b != d:
        left += delta if wrong == len(lines) else 0
        lines.append(f"=\\frac{{{left}}}{{{common}}}+\\frac{{{right}}}{{{common}}}")
    total = left + right + (delta if wrong == len(lines) else 0)
    lines.append(f"=\\frac{{{total}}}{{{common}}}")
    divisor = math.gcd(total, common)
    if divisor > 1:
        reduced = total // divisor + (delta if wrong == len(lines) else 0)
        lines.append("=" + _frac(reduced, common // divisor))
    return lines


def _radical_sum_lines(nums: tuple[int, ...], wrong: int | None, delta: int) -> list[str]:
    """Each root simplified (when one is not already), then the like roots combined."""
    first, sign, second = nums
    (a, k), (b, _) = _root_parts(first), _root_parts(second)
    op = "+" if sign > 0 else "-"
    lines: list[str] = []
    if a > 1 or b > 1:
        a += delta if wrong == len(lines) else 0
        lines.append(f"={_root_term(a, k)}{op}{_root_term(b, k)}")
    total = a + sign * b + (delta if wrong == len(lines) else 0)
    lines.append("=" + _root_term(total, k))
    return lines


def _midpoint_lines(nums: tuple[int, ...], wrong: int | None, delta: int) -> list[str]:
    x1, y1, x2, y2 = nums
    lines: list[str] = []
    for name, p, q in (("x", x1, x2), ("y", y1, y2)):
        value = p + q + (delta if wrong == len(lines) else 0)
        lines.append(f"{name}=\\frac{{{p}+{q}}}{{2}}={_frac(value, 2)}")
    return lines


def _parse(question: str) -> tuple[MathKind, tuple[int, ...]]:
    """(kind, numbers) of a question this task wrote."""
    if match := _FRACTION_SUM.match(question):
        return "fraction_sum", tuple(int(g) for g in match.groups())
    if match := _RADICAL_SUM.match(question):
        first, op, second = match.groups()
        return "radical_sum", (int(first), 1 if op == "+" else -1, int(second))
    if match := _MIDPOINT.match(question):
        return "midpoint", tuple(int(g) for g in match.groups())
    raise ValueError(f"not a math_style question: {question!r}")


_LINES: dict[MathKind, Callable[[tuple[int, ...], int | None, int], list[str]]] = {
    "fraction_sum": _fraction_sum_lines,
    "radical_sum": _radical_sum_lines,
    "midpoint": _midpoint_lines,
}


def _questions(kind: str, largest: int) -> list[str]:
    """Every question of `kind` with numbers up to `largest`, in a fixed order."""
    if kind == "fraction_sum":  # proper fractions in lowest terms, denominators 2..largest
        fractions = [
            (a, b) for b in range(2, largest + 1) for a in range(1, b) if math.gcd(a, b) == 1
        ]
        return [
            f"\\frac{{{a}}}{{{b}}}+\\frac{{{c}}}{{{d}}}" for a, b in fractions for c, d in fractions
        ]
    if kind == "radical_sum":  # like roots, coefficients 1..largest; a difference stays > 0
        return [
            f"\\sqrt{{{a * a * k}}}{op}\\sqrt{{{b * b * k}}}"
            for k in RADICANDS
            for a in range(1, largest + 1)
            for b in range(1, largest + 1)
            for op in "+-"
            if op == "+" or a > b
        ]
    points = [(x, y) for x in range(largest + 1) for y in range(largest + 1)]
    return [
        f"midpoint of ({x1},{y1}) and ({x2},{y2})"
        for x1, y1 in points
        for x2, y2 in points
        if (x1, y1) != (x2, y2)
    ]


@cache
def _split_questions(kind: str, largest: int, test_fraction: float, split: Split) -> list[str]:
    return [q for q in _questions(kind, largest) if split_of(q, test_fraction) == split]


class MathStyleTask:
    """Questions of `kinds`, numbers up to `largest` (denominators, root coefficients,
    coordinates); each problem's kind is drawn uniformly, then a question of that kind."""

    name = "math_style"
    answer_format = ANSWER_FORMATS["boxed"]

    def __init__(
        self, kinds: tuple[MathKind, ...] = KINDS, largest: int = 4, test_fraction: float = 0.2
    ) -> None:
        unknown = sorted(set(kinds) - set(KINDS))
        if not kinds or unknown:
            raise ValueError(f"math_style kinds must be a non-empty subset of {KINDS}")
        if largest < 2:
            raise ValueError(f"math_style largest must be >= 2 (got {largest})")
        self.kinds, self.largest, self.test_fraction = tuple(kinds), largest, test_fraction

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` seeded problems of `split`; a question's split is fixed by its hash."""
        pools = {
            k: _split_questions(k, self.largest, self.test_fraction, split) for k in self.kinds
        }
        kinds = [k for k in self.kinds if pools[k]]
        if not kinds and n > 0:
            raise TaskDataError(
                f"math_style has no {split} question with task.math_style.max_number = "
                f"{self.largest}: raise task.math_style.max_number or add kinds to "
                "task.math_style.kinds"
            )
        rng = random.Random(f"math_style/{split}/{seed}")
        out: list[Problem] = []
        for i in range(n):
            kind = rng.choice(kinds)
            question = rng.choice(pools[kind])
            solution = self.solution(question)
            out.append(
                Problem(
                    problem_id=f"math_style-{split}-{seed}-{i}",
                    question=question,
                    answer=_boxed_content(solution),
                    solution=solution,
                    meta={"kind": kind},
                )
            )
        return out

    @staticmethod
    def solution(question: str, wrong_step: int | None = None, delta: int = 0) -> str:
        """The gold solution of `question`; with `wrong_step`, that line's result is off by
        `delta` (a numerator, a root's coefficient, a coordinate's doubled value) and later
        lines continue consistently from it."""
        kind, nums = _parse(question)
        lines = _LINES[kind](nums, wrong_step, delta)
        if kind == "midpoint":
            x, y = (line.rsplit("=", 1)[1] for line in lines)
            answer = f"({x}, {y})"
        else:
            answer = lines[-1].removeprefix("=")
        return "\n".join([*lines, f"\\boxed{{{answer}}}"])

    def corrupt(self, problem: Problem, rng: random.Random) -> str:
        """A solution of `problem` with one wrong step (off by 1-3), the rest consistent."""
        n_lines = len(split_steps(self.solution(problem.question))) - 1
        return self.solution(problem.question, rng.randrange(n_lines), rng.choice(STEP_DELTAS))

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.answer_format.is_correct(problem.answer, completion)

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        """Per step of `split_steps(completion)`: True when the step is right w.r.t. the question.

        A `\\boxed{}` line is right when its answer equals the gold one (the verifier's
        check). Any other line is a chain `side=side=...`, each side read exactly
        (math_exprs): for a sum, every side must have the question's value (a line starting
        with `=` continues from the question); for a midpoint the line must start with `x=`
        or `y=` and every later side have that coordinate's value. A line that cannot be
        read, or states a wrong value, is wrong.
        """
        kind, nums = _parse(problem.question)
        if kind == "midpoint":
            x1, y1, x2, y2 = nums
            coordinates = {
                "x": rational(Fraction(x1 + x2, 2)),
                "y": rational(Fraction(y1 + y2, 2)),
            }
            check = _coordinate_line_checker(coordinates)
        else:
            target = evaluate(problem.question)
            assert target is not None, problem.question
            check = _value_line_checker(target)
        labels = []
        for step in split_steps(completion):
            if "\\boxed" in step:
                answer = last_boxed(step)
                labels.append(
                    answer is not None and self.answer_format.equal(problem.answer, answer)
                )
            else:
                labels.append(check(step))
        return labels


def _boxed_content(solution: str) -> str:
    answer = last_boxed(solution)
    assert answer is not None, solution
    return answer


def _value_line_checker(target: Surd) -> Callable[[str], bool]:
    def right(line: str) -> bool:
        sides = line.split("=")
        if not sides[0].strip():
            sides = sides[1:]  # `=...` continues from the question
        return bool(sides) and all(evaluate(side) == target for side in sides)

    return right


def _coordinate_line_checker(coordinates: dict[str, Surd]) -> Callable[[str], bool]:
    def right(line: str) -> bool:
        name, *sides = (side.strip() for side in line.split("="))
        target = coordinates.get(name)
        return (
            target is not None
            and bool(sides)
            and all(evaluate(side, coordinates) == target for side in sides)
        )

    return right


class MathStyleSettings(BaseModel):
    """The math_style task's knobs: which kinds of question and how large their numbers."""

    model_config = ConfigDict(extra="forbid")

    kinds: list[MathKind] = Field(
        default_factory=lambda: list(KINDS),
        min_length=1,
        description="Which kinds of question to draw (each problem's kind uniformly): "
        "fraction_sum (\\frac{1}{2}+\\frac{1}{3}), radical_sum (\\sqrt{8}+\\sqrt{2}), "
        "midpoint (of two points: a pair of fractions).",
    )
    max_number: int = Field(
        default=4,
        ge=2,
        le=12,
        description="Largest number in a question (2-12): fraction denominators "
        "2..max_number, root coefficients 1..max_number, point coordinates 0..max_number.",
    )


def build(settings: MathStyleSettings, common: TaskCommon) -> MathStyleTask:
    return MathStyleTask(tuple(settings.kinds), settings.max_number, common.test_fraction)


TASK = TaskSpec(
    name="math_style",
    settings=MathStyleSettings,
    build=build,
    summary="built-in fraction sums, radical sums and midpoints with \\boxed{} LaTeX answers",
    answer_format=MathStyleTask.answer_format.name,
    earlier_keys={"math_kinds": "kinds", "math_max": "max_number"},
)
