"""Adapter for reasoning-gym's procedural tasks (`chain_sum`, `basic_arithmetic`, `gsm_symbolic`).

reasoning-gym is optional (`pip install 'itergrpo[real]'`) and imported only when a task is built.
Answers are extracted from the `####` line and scored with the dataset's `score_answer`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field

from grpo_core.data.answer_formats import ANSWER_FORMATS
from grpo_core.data.tasks.base import Problem, Split, TaskCommon, TaskDataError, TaskSpec
from grpo_core.data.tasks.splits import split_of

Dataset = Literal["chain_sum", "basic_arithmetic", "gsm_symbolic"]
SUPPORTED: tuple[str, ...] = get_args(Dataset)


def _import_reasoning_gym() -> Any:
    try:
        import reasoning_gym
    except ImportError as err:
        raise ImportError(
            "the reasoning_gym task needs the reasoning-gym package: pip install 'itergrpo[real]'"
        ) from err
    return reasoning_gym


def gold_solution(entry: dict[str, Any]) -> str | None:
    """A GSM8K-format gold solution for warm start, when the generator gives enough for one.

    The generator's chain of thought if it has one (a `#### <answer>` line added if
    missing); else, for arithmetic tasks (`chain_sum`, `basic_arithmetic`), the expression
    and its value on one line; else None.
    """
    meta = entry.get("metadata", {})
    answer = str(entry["answer"])
    cot = meta.get("answer_cot")
    if isinstance(cot, str) and cot.strip():
        return cot if "####" in cot else f"{cot.rstrip()}\n#### {answer}"
    expression = meta.get("expression")
    if isinstance(expression, str) and expression.strip():
        return f"{expression.strip()} = {answer}\n#### {answer}"
    return None


class ReasoningGymTask:
    """One reasoning-gym dataset; `options` are its generator's options (e.g. `max_terms`)."""

    answer_format = ANSWER_FORMATS["gsm8k"]

    def __init__(
        self, dataset: str, options: dict[str, Any] | None = None, test_fraction: float = 0.2
    ) -> None:
        if dataset not in SUPPORTED:
            raise ValueError(f"reasoning_gym dataset must be one of {SUPPORTED} (got {dataset!r})")
        self._rg = _import_reasoning_gym()
        self.dataset, self.options = dataset, dict(options or {})
        self.test_fraction = test_fraction
        self.name = f"reasoning_gym/{dataset}"
        self._scorer = self._rg.create_dataset(dataset, size=1, seed=0, **self.options)

    def problems(self, split: Split, n: int, seed: int) -> list[Problem]:
        """`n` problems of `split`, generated in chunks from derived seeds, split by hash."""
        out: list[Problem] = []
        chunk, attempt = max(2 * n, 16), 0
        while len(out) < n:
            if attempt > 50:
                raise TaskDataError(
                    f"reasoning_gym/{self.dataset}: only {len(out)} distinct {split} problems "
                    f"of {n} after {attempt} chunks; widen task.reasoning_gym.options"
                )
            derived = int(hashlib.sha256(f"{seed}/{split}/{attempt}".encode()).hexdigest()[:8], 16)
            generated = self._rg.create_dataset(
                self.dataset, size=chunk, seed=derived, **self.options
            )
            for entry in generated:
                if len(out) == n:
                    break
                if split_of(entry["question"], self.test_fraction) == split:
                    out.append(self._problem(entry, split, seed, len(out)))
            attempt += 1
        return out

    def _problem(self, entry: dict[str, Any], split: Split, seed: int, i: int) -> Problem:
        return Problem(
            problem_id=f"{self.name}-{split}-{seed}-{i}",
            question=entry["question"],
            answer=str(entry["answer"]),
            solution=gold_solution(entry),
            meta={"rg_metadata": json.dumps(entry.get("metadata", {}), default=str)},
        )

    def is_correct(self, problem: Problem, completion: str) -> bool:
        pred = self.answer_format.extract(completion)
        if pred is None:
            return False
        if self.answer_format.equal(problem.answer, pred):
            return True
        entry = {
            "question": problem.question,
            "answer": problem.answer,
            "metadata": json.loads(problem.meta.get("rg_metadata", "{}")),
        }
        return float(self._scorer.score_answer(pred, entry)) >= 1.0

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        return None


class ReasoningGymSettings(BaseModel):
    """The reasoning_gym task's knobs: which reasoning-gym dataset, with which options."""

    model_config = ConfigDict(extra="forbid")

    dataset: Dataset = Field(default="chain_sum", description="Which reasoning-gym dataset.")
    options: dict[str, Any] = Field(
        default_factory=dict,
        description="The dataset generator's options, e.g. {'min_terms': 2, 'max_terms': 2}.",
    )


def build(settings: ReasoningGymSettings, common: TaskCommon) -> ReasoningGymTask:
    return ReasoningGymTask(settings.dataset, settings.options, common.test_fraction)


TASK = TaskSpec(
    name="reasoning_gym",
    settings=ReasoningGymSettings,
    build=build,
    summary="a reasoning-gym dataset (needs itergrpo[real])",
    answer_format=ReasoningGymTask.answer_format.name,
    earlier_keys={"rg_task": "dataset", "rg_kwargs": "options"},
)
