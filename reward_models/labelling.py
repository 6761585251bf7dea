"""Reward-model labels: ORM labels from the verifier, PRM labels by Math-Shepherd Monte Carlo.

PRM rule (docs/algorithm.md section 7): for each step prefix of a sampled solution, N
completions are sampled with the current policy; hard = 1 if any reaches the gold answer,
soft = the fraction that do. The last step is the whole solution, so it is labelled by the
verifier directly and needs no completions (n_completions = 0, hard = soft = outcome).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from grpo_core.contracts.rollout import Sampler, SamplingParams
from grpo_core.data.reasoning_steps import Decoder, split_steps, step_end_token_indices, step_spans
from grpo_core.data.tasks.base import Problem, Task
from reward_models.config import LabellingConfig

_Row = TypeVar("_Row", bound="OrmLabel | PrmLabel")


def _from_row(cls: type[_Row], row: Mapping[str, Any]) -> _Row:
    """Build a label from a store row, ignoring extra columns (run_id, iteration, ...)."""
    return cls(**{f.name: row[f.name] for f in fields(cls) if f.name in row})


@dataclass(frozen=True)
class LabelledSample:
    """One sampled solution to label: prompt_text is the formatted prompt the policy saw."""

    problem: Problem
    prompt_text: str
    completion: str
    completion_ids: list[int]
    sample_index: int


@dataclass(frozen=True)
class OrmLabel:
    """A row of `orm_labels`: the verifier's 1/0 for one output."""

    problem_id: str
    sample_index: int
    label: int

    def __post_init__(self) -> None:
        if self.label not in (0, 1):  # NaN fails this too
            raise ValueError(
                f"ORM label of {self.problem_id}#{self.sample_index} must be 0 or 1 "
                f"(got {self.label!r})"
            )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> OrmLabel:
        return _from_row(cls, row)


@dataclass(frozen=True)
class PrmLabel:
    """A row of `prm_labels`: one step of one output with its Monte-Carlo and exact labels.

    step_end_token indexes the completion's token ids; exact_label is None when the task
    cannot check steps.
    """

    problem_id: str
    sample_index: int
    step_index: int
    step_text: str
    step_end_token: int
    n_completions: int
    n_correct: int
    hard_label: int
    soft_label: float
    exact_label: int | None = None

    def __post_init__(self) -> None:
        where = f"PRM label of {self.problem_id}#{self.sample_index} step {self.step_index}"
        if not (isinstance(self.soft_label, int | float) and 0.0 <= self.soft_label <= 1.0):
            raise ValueError(f"{where}: soft_label must be in [0, 1] (got {self.soft_label!r})")
        if self.hard_label not in (0, 1):
            raise ValueError(f"{where}: hard_label must be 0 or 1 (got {self.hard_label!r})")
        if self.exact_label not in (0, 1, None):
            raise ValueError(f"{where}: exact_label must be 0, 1 or None (got {self.exact_label})")
        if not 0 <= self.n_correct <= self.n_completions:
            raise ValueError(
                f"{where}: need 0 <= n_correct <= n_completions "
                f"(got {self.n_correct} of {self.n_completions})"
            )

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> PrmLabel:
        return _from_row(cls, row)


def orm_labels(task: Task, samples: Sequence[LabelledSample]) -> list[OrmLabel]:
    """Verifier labels (1 correct / 0 not); an empty completion is 0."""
    return [
        OrmLabel(
            s.problem.problem_id,
            s.sample_index,
            int(bool(s.completion.strip()) and task.is_correct(s.problem, s.completion)),
        )
        for s in samples
    ]


def step_prefixes(completion: str) -> list[str]:
    """Completion text up to the end of each step, each followed by a newline."""
    return [completion[:end] + "\n" for _, end in step_spans(completion)]


def _exact_labels(task: Task, sample: LabelledSample, n_steps: int) -> list[int | None]:
    exact = task.step_labels(sample.problem, sample.completion)
    if exact is None:
        return [None] * n_steps
    if len(exact) != n_steps:
        raise ValueError(
            f"task {task.name!r} gave {len(exact)} step labels for {n_steps} steps of "
            f"{sample.problem.problem_id}#{sample.sample_index}: its step rule must be split_steps"
        )
    return [int(x) for x in exact]


def prm_labels_monte_carlo(
    engine: Sampler,
    tokenizer: Decoder,
    task: Task,
    samples: Sequence[LabelledSample],
    cfg: LabellingConfig,
    seed: int,
) -> list[PrmLabel]:
    """Math-Shepherd PRM labels for every step of every sample (none for empty completions).

    All non-final step prefixes of all samples go to the engine in one `generate` call, with
    `cfg.n_completions` samples each. With `cfg.shared_prefixes`, a prefix that several
    samples of one problem share is sent once and its estimate is every such step's label.
    """
    steps_of = [split_steps(s.completion) for s in samples]
    prompts: list[str] = []
    owners: list[tuple[int, str]] = []  # (sample position, prefix text) per prompt
    prompt_of_step: list[int] = []  # per non-final step, in sample order: its prompt's index
    first_prompt: dict[tuple[str, str], int] = {}
    for pos, (sample, steps) in enumerate(zip(samples, steps_of, strict=True)):
        for prefix in step_prefixes(sample.completion)[: max(len(steps) - 1, 0)]:
            key = (sample.problem.problem_id, sample.prompt_text + prefix)
            if cfg.shared_prefixes and key in first_prompt:
                prompt_of_step.append(first_prompt[key])
                continue
            first_prompt[key] = len(prompts)
            prompt_of_step.append(len(prompts))
            prompts.append(key[1])
            owners.append((pos, prefix))

    n = cfg.n_completions
    counts_of_prompt: list[int] = []
    if prompts:
        params = SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature)
        batch = engine.generate(prompts, n, params, seed)
        if len(batch) != len(prompts) * n:
            raise ValueError(f"engine returned {len(batch)} outputs for {len(prompts)} x {n}")
        for i, (pos, prefix) in enumerate(owners):
            problem = samples[pos].problem
            texts = batch.texts[i * n : (i + 1) * n]
            counts_of_prompt.append(sum(task.is_correct(problem, prefix + t) for t in texts))
    correct_counts = [counts_of_prompt[i] for i in prompt_of_step]

    rows: list[PrmLabel] = []
    cursor = 0
    for sample, steps in zip(samples, steps_of, strict=True):
        if not steps:
            continue
        ends = step_end_token_indices(sample.completion_ids, tokenizer)
        if len(ends) != len(steps):
            raise ValueError(
                f"{sample.problem.problem_id}#{sample.sample_index}: completion text has "
                f"{len(steps)} steps but its token ids decode to {len(ends)}"
            )
        exact = _exact_labels(task, sample, len(steps))
        outcome = int(task.is_correct(sample.problem, sample.completion))
        for j, step in enumerate(steps):
            if j < len(steps) - 1:
                n_done, n_ok = n, correct_counts[cursor]
                cursor += 1
                hard, soft = int(n_ok > 0), n_ok / n
            else:
                n_done, n_ok, hard, soft = 0, 0, outcome, float(outcome)
            rows.append(
                PrmLabel(
                    problem_id=sample.problem.problem_id,
                    sample_index=sample.sample_index,
                    step_index=j,
                    step_text=step,
                    step_end_token=ends[j],
                    n_completions=n_done,
                    n_correct=n_ok,
                    hard_label=hard,
                    soft_label=soft,
                    exact_label=exact[j],
                )
            )
    return rows


def label_agreement(rows: Sequence[PrmLabel], mc_only: bool = False) -> float:
    """Share of steps whose MC hard label equals the exact label (rows without one skipped).

    With mc_only, the verifier-labelled final steps are left out too. NaN when nothing is left.
    """
    pairs = [
        (r.hard_label, r.exact_label)
        for r in rows
        if r.exact_label is not None and (r.n_completions > 0 or not mc_only)
    ]
    if not pairs:
        return math.nan
    return sum(h == e for h, e in pairs) / len(pairs)
