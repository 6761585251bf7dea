"""Built-in task: seeded multi-step integer arithmetic chains whose every step is checked exactly.

Question `3+4-2`, gold solution one step per line, each continuing from the previous result:
`3+4=7` / `7-2=5` / `#### 5`. With `*` the question is parenthesised so that ordinary
precedence gives the chain's left-to-right value: `(3+4)*2`.
"""

from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass
from functools import cache

from pydantic import BaseModel, ConfigDict, Field, model_validator

from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.answers import answers_match, extract_answer
from grpo_core.data.reasoning_steps import split_steps
from grpo_core.data.tasks.base import Problem, Split, TaskCommon, TaskDataError, TaskSpec
from grpo_core.data.tasks.splits import split_of

ENUMERABLE = 200_000  # largest family whose questions are listed to count a split

_STEP = re.compile(r"^([+-]?\d+)([+\-*])([+-]?\d+)=([+-]?\d+)$")


def _apply(left: int, op: str, right: int) -> int:
    return left + right if op == "+" else left - right if op == "-" else left * right


@dataclass(frozen=True)
class Chain:
    """Operands a0..an and operators o1..on of one arithmetic chain."""

    operands: tuple[int, ...]
    operators: tuple[str, ...]

    def results(self) -> list[int]:
        """Running value after each step."""
        value, out = self.operands[0], []
        for op, right in zip(self.operators, self.operands[1:], strict=True):
            value = _apply(value, op, right)
            out.append(value)
        return out

    def question(self) -> str:
        text = str(self.operands[0])
        for i, (op, right) in enumerate(zip(self.operators, self.operands[1:], strict=True)):
            if op == "*" and i > 0 and any(o != "*" for o in self.operators[:i]):
                text = f"({text})"
            text += f"{op}{right}"
        return text

    @staticmethod
    def parse(question: str) -> Chain:
        tokens = re.findall(r"\d+|[+\-*]", question)
        operands = tuple(int(t) for t in tokens[0::2])
        return Chain(operands, tuple(tokens[1::2]))


@cache
def _count_in_split(
    min_steps: int,
    max_steps: int,
    operand_max: int,
    operators: str,
    test_fraction: float,
    split: Split,
) -> int:
    ops = sorted(set(operators))
    count = 0
    for steps in range(min_steps, max_steps + 1):
        for operands in itertools.product(range(1, operand_max + 1), repeat=steps + 1):
            for chosen in itertools.product(ops, repeat=steps):
                question = Chain(operands, chosen).question()
                count += split_of(question, test_fraction) == split
    return count


def format_step(left: int, op: str, right: int, result: int) -> str:
    return f"{left}{op}{right}={result}"


class ArithTask:
    """Chains of `min_steps`..`max_steps` operations on operands 1..`operand_max`."""

    name = "arith"
    answer_format = ANSWER_FORMATS["gsm8k"]

    def __init__(
        self,
        min_steps: int = 2,
        max_steps: int = 4,
        operand_max: int = 9,
        operators: str = "+-",
        test_fraction: float = 0.2,
        distinct_test: bool = False,
    ) -> None:
        if not 1 <= min_steps <= max_steps:
            raise ValueError(
                f"arith needs 1 <= min_steps <= max_steps (got {min_steps}, {max_steps})"
            )
        if operand_max < 1:
            raise ValueError(f"arith operand_max must be >= 1 (got {operand_max})")
        if not operators or set(operators) - set("+-*"):
            raise ValueError(
                f"arith operators must be a non-empty subset of '+-*' (got {operators!r})"
            )
        if not 0.0 < test_fraction < 1.0:
            raise ValueError(f"arith test_fraction must be in (0, 1) (got {test_fraction})")
        self.min_steps, self.max_steps = min_steps, max_steps
        self.operand_max, self.operators = operand_max, operators
        self.test_fraction = test_fraction
        self.distinct_test = distinct_test

    def family_size(self) -> int:
        """How many different questions the knobs allow (both splits together)."""
        ops = len(set(self.operators))
        return sum(
            self.operand_max ** (s + 1) * ops**s for s in range(self.min_steps, self.max_steps + 1)
        )

    def split_size(self, split: Split) -> int | None:
        """How many different questions `split` holds, counted when the family is small
        enough to list (None above ENUMERABLE)."""
        if self.family_size() > ENUMERABLE:
            return None
        return _count_in_split(
            self.min_steps,
            self.max_steps,
            self.operand_max,
            self.operators,
            self.test_fraction,
            split,
        )

    def _random_chain(self, rng: random.Random) -> Chain:
        steps = rng.randint(self.min_steps, self.max_steps)
        operands = tuple(rng.randint(1, self.operand_max) for _ in range(steps + 1))
        return Chain(operands, tuple(rng.choice(self.operators) for _ in range(steps)))

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` seeded problems of `split`; a question's split is fixed by its hash. With
        `distinct_test`, no test question twice: the same draws with the repeats skipped
        (training draws repeat: the warm start draws thousands)."""
        distinct = self.distinct_test and split == "test"
        if distinct:
            self._check_enough(split, n)
        rng = random.Random(f"arith/{split}/{seed}")
        out: list[Problem] = []
        seen: set[str] = set()
        while len(out) < n:
            chain = self._random_chain(rng)
            question = chain.question()
            if split_of(question, self.test_fraction) != split:
                continue
            if distinct:
                if question in seen:
                    continue
                seen.add(question)
            out.append(
                Problem(
                    problem_id=f"arith-{split}-{seed}-{len(out)}",
                    question=question,
                    answer=str(chain.results()[-1]),
                    solution=self.solution(chain),
                )
            )
        return out

    def _check_enough(self, split: Split, n: int) -> None:
        available = self.split_size(split)
        if available is not None and n > available:
            raise TaskDataError(
                f"arith has {available} different {split} questions with these knobs and "
                f"task.arith.distinct_test = true, but {n} were asked for: ask for fewer "
                "(evaluation.n_prompts, reward_models.eval_prompts), widen the task "
                "(task.arith.operand_max, task.arith.max_steps, task.arith.operators), or "
                "set task.arith.distinct_test = false"
            )

    @staticmethod
    def solution(chain: Chain, wrong_step: int | None = None, delta: int = 0) -> str:
        """Gold solution; with `wrong_step`, that step's result is off by `delta` and later
        steps continue consistently from the wrong value (one injected step error)."""
        lines, value = [], chain.operands[0]
        for i, (op, right) in enumerate(zip(chain.operators, chain.operands[1:], strict=True)):
            result = _apply(value, op, right) + (delta if i == wrong_step else 0)
            lines.append(format_step(value, op, right, result))
            value = result
        return "\n".join([*lines, f"#### {value}"])

    def corrupt(self, problem: Problem, rng: random.Random) -> str:
        """A solution of `problem` with one wrong step (off by 1-3), the rest consistent with it."""
        chain = Chain.parse(problem.question)
        wrong = rng.randrange(len(chain.operators))
        return self.solution(chain, wrong, rng.choice([-3, -2, -1, 1, 2, 3]))

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return self.answer_format.is_correct(problem.answer, completion)

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        """Per step of `split_steps(completion)`: True when the step is right w.r.t. the question.

        Calculation line k must read `<true value after k steps><op k+1><operand k+1>=<true
        value after k+1 steps>` (spaces ignored), so a line that is internally consistent but
        continues from a wrong earlier result is wrong. A `####` line is right when its answer
        equals the gold answer; any calculation line beyond the chain's length is wrong.
        """
        chain = Chain.parse(problem.question)
        results = chain.results()
        prev = [chain.operands[0], *results[:-1]]
        labels, k = [], 0
        for step in split_steps(completion):
            if step.startswith("####"):
                labels.append(answers_match(extract_answer(step), problem.answer))
                continue
            match = _STEP.match(step.replace(" ", ""))
            ok = (
                match is not None
                and k < len(chain.operators)
                and int(match.group(1)) == prev[k]
                and match.group(2) == chain.operators[k]
                and int(match.group(3)) == chain.operands[k + 1]
                and int(match.group(4)) == results[k]
            )
            labels.append(ok)
            k += 1
        return labels


class ArithSettings(BaseModel):
    """The arith task's knobs: how long its chains are and what they draw from."""

    model_config = ConfigDict(extra="forbid")

    min_steps: int = Field(
        default=2, ge=1, le=20, description="Fewest operations per chain (1-20)."
    )
    max_steps: int = Field(
        default=4, ge=1, le=20, description="Most operations per chain (>= min_steps, <= 20)."
    )
    operand_max: int = Field(
        default=9,
        ge=1,
        le=10**6,
        description="Operands are drawn from 1..operand_max (9: one digit).",
    )
    operators: str = Field(
        default="+-", description="Operators to draw from, a non-empty subset of '+-*'."
    )
    distinct_test: bool = Field(
        default=False,
        description="Draw no test question twice within an evaluation (the policy's, the "
        "reward models' drift measurement); refused when the test split has fewer different "
        "questions than asked. Off: test draws repeat (a small family has few). Training "
        "draws always repeat.",
    )

    @model_validator(mode="after")
    def _check(self) -> ArithSettings:
        if self.min_steps > self.max_steps:
            raise ValueError(
                f"task.arith.min_steps ({self.min_steps}) must be <= task.arith.max_steps "
                f"({self.max_steps}): lower min_steps or raise max_steps"
            )
        if not self.operators or set(self.operators) - set("+-*"):
            raise ValueError(
                f"task.arith.operators must be a non-empty subset of '+-*' (got "
                f"{self.operators!r}): e.g. operators: '+-'"
            )
        return self


def build(settings: ArithSettings, common: TaskCommon) -> ArithTask:
    return ArithTask(
        settings.min_steps,
        settings.max_steps,
        settings.operand_max,
        settings.operators,
        common.test_fraction,
        distinct_test=settings.distinct_test,
    )


TASK = TaskSpec(
    name="arith",
    settings=ArithSettings,
    build=build,
    summary="built-in arithmetic chains",
    answer_format=ArithTask.answer_format.name,
    earlier_keys={k: k for k in ArithSettings.model_fields},
)
