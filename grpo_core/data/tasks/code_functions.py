"""Built-in code task: seeded one-line Python functions described in words, each verified by
running its tests (assert statements) against the output's last ```python block in the Python
tool's sandbox (answer format `python_tests`).

    Write a Python function f(x) that returns 3 times x plus 2.
    ```python
    def f(x):
        return 3 * x + 2
    ```
    tests: assert f(-2) == -4 / assert f(0) == 2 / ... (the problem's gold answer)
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.tasks.base import Problem, Split, TaskCommon, TaskDataError, TaskSpec
from grpo_core.data.tasks.splits import split_of

CodeKind = Literal["linear", "square_plus", "larger_of", "remainder"]
KINDS: tuple[CodeKind, ...] = get_args(CodeKind)
TEST_INPUTS = (-3, -1, 0, 2, 5, 11)
# kind -> the words of the question, the expression (both with {a} and {b}), and its value
_TEMPLATES: dict[str, tuple[str, str, Callable[[int, int, int], int]]] = {
    "linear": ("{a} times x plus {b}", "{a} * x + {b}", lambda a, b, x: a * x + b),
    "square_plus": ("x squared plus {a}", "x * x + {a}", lambda a, b, x: x * x + a),
    "larger_of": ("the larger of x and {a}", "max(x, {a})", lambda a, b, x: max(x, a)),
    "remainder": ("the remainder of x divided by {a}", "x % {a}", lambda a, b, x: x % a),
}


@dataclass(frozen=True)
class Function:
    """One question's function: its expression in Python and the tests its values give."""

    code: str
    tests: str


@cache
def _questions(kind: str, largest: int) -> dict[str, Function]:
    """Every question of `kind` with numbers up to `largest` -> its function."""
    words, code, value = _TEMPLATES[kind]
    low = 2 if kind == "remainder" else 1
    out: dict[str, Function] = {}
    for a in range(low, largest + 1):
        for b in range(1, largest + 1) if kind == "linear" else (0,):
            tests = "\n".join(f"assert f({x}) == {value(a, b, x)}" for x in TEST_INPUTS)
            question = f"Write a Python function f(x) that returns {words.format(a=a, b=b)}."
            out[question] = Function(code.format(a=a, b=b), tests)
    return out


class CodeFunctionsTask:
    """Questions of `kinds` with numbers up to `largest`; each problem's kind drawn uniformly,
    then a question of that kind; a question's split fixed by its hash."""

    name = "code_functions"
    answer_format = ANSWER_FORMATS["python_tests"]

    def __init__(
        self, kinds: tuple[CodeKind, ...] = KINDS, largest: int = 9, test_fraction: float = 0.2
    ) -> None:
        self.kinds, self.largest, self.test_fraction = tuple(kinds), largest, test_fraction

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        pools = {
            kind: [
                (q, function)
                for q, function in _questions(kind, self.largest).items()
                if split_of(q, self.test_fraction) == split
            ]
            for kind in self.kinds
        }
        kinds = [k for k in self.kinds if pools[k]]
        if not kinds and n > 0:
            raise TaskDataError(
                f"code_functions has no {split} question with task.code_functions.max_number "
                f"= {self.largest}: raise it or add kinds to task.code_functions.kinds"
            )
        rng = random.Random(f"code_functions/{split}/{seed}")
        out: list[Problem] = []
        for i in range(n):
            kind = rng.choice(kinds)
            question, function = rng.choice(pools[kind])
            out.append(
                Problem(
                    problem_id=f"code_functions-{split}-{seed}-{i}",
                    question=question,
                    answer=function.tests,
                    solution=f"```python\ndef f(x):\n    return {function.code}\n```",
                    meta={"kind": kind},
                )
            )
        return out

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.answer_format.is_correct(problem.answer, completion)

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        return None  # no exact step labels: a program is judged whole, by its tests


class CodeFunctionsSettings(BaseModel):
    """The code_functions task's knobs: which kinds of function and how large their numbers."""

    model_config = ConfigDict(extra="forbid")

    kinds: list[CodeKind] = Field(
        default_factory=lambda: list(KINDS),
        min_length=1,
        description="Which kinds of function to draw (each problem's kind uniformly): linear "
        "(3 times x plus 2), square_plus (x squared plus 4), larger_of (the larger of x and 5), "
        "remainder (the remainder of x divided by 3).",
    )
    max_number: int = Field(
        default=9, ge=2, le=99, description="Largest number in a question (2-99)."
    )


def build(settings: CodeFunctionsSettings, common: TaskCommon) -> CodeFunctionsTask:
    return CodeFunctionsTask(tuple(settings.kinds), settings.max_number, common.test_fraction)


TASK = TaskSpec(
    name="code_functions",
    settings=CodeFunctionsSettings,
    build=build,
    summary="built-in one-line Python functions, verified by running their tests in the sandbox",
    answer_format=CodeFunctionsTask.answer_format.name,
)
