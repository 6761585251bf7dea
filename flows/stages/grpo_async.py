"""Asynchronous GRPO in the GRPO stage (grpo.async): the sampler that runs ahead of the updates
on its own copy of the policy, the plan of what each step samples, and the batches sampled
ahead, stored with the progress checkpoint (grpo_core/engines/async_sampler.py,
docs/algorithm.md section 15)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict

from transformers import PreTrainedModel

from flows.config import GRPOStageSection
from flows.stages.grpo_progress import ResumePoint, Row
from flows.stages.grpo_prompts import PromptCursor
from grpo_core.algo.step import StepParts, prompt_indices_at
from grpo_core.contracts.rollout import RolloutBatch, RolloutEngine
from grpo_core.engines.async_sampler import AsyncSampler, SampleRequest, VersionedBatch
from grpo_core.model.prompts import Prompter


def sampling_copy(model: PreTrainedModel) -> PreTrainedModel:
    """The sampler's own copy of the stage's policy: the trainer updates `model` in place
    while the sampler samples an older version."""
    return copy.deepcopy(model).eval().requires_grad_(False)


def start_async_sampler(
    engine: RolloutEngine | None,
    steps: StepParts,
    cursor: PromptCursor,
    prompter: Prompter,
    step_seed: Callable[[int], int],
    settings: GRPOStageSection,
    resume: ResumePoint,
) -> AsyncSampler:
    """The stage's sampler on `engine` (its own, not the trained model) of the steps from the
    resume point on (first the batches its progress checkpoint stored), started. Each step
    takes the cursor's next prompts_per_step prompts (grpo.async refuses dynamic sampling,
    whose extra rounds draw more), so its prompts are known ahead."""
    assert engine is not None, "the asynchronous sampler needs an engine of its own"
    first_step, first_prompt = resume.next_step, cursor.position
    per_step = settings.prompts_per_step

    def plan(step: int) -> SampleRequest:
        at = first_prompt + (step - first_step) * per_step
        problems = [cursor.pool[i] for i in prompt_indices_at(len(cursor.pool), at, per_step)]
        seed = step_seed(step)
        params = steps.round_sampler(seed, "").params
        prompts = [prompter(p.question) for p in problems]
        return SampleRequest(prompts, steps.group_size, params, seed)

    sampler = AsyncSampler(
        engine,
        plan,
        settings.async_,
        first_step=first_step,
        steps=settings.steps,
        sampled=[_versioned_batch(row) for row in resume.in_flight],
    )
    return sampler.start()


def in_flight_rows(sampler: AsyncSampler | None, next_step: int) -> list[Row] | None:
    """What a progress checkpoint after `next_step` steps stores of the batches sampled ahead
    (AsyncSampler.in_flight), as JSON-able rows (floats round-trip exactly); None when the
    stage samples synchronously."""
    if sampler is None:
        return None
    batches = sampler.in_flight(next_step)
    return [{"step": b.step, "version": b.version, "batch": asdict(b.batch)} for b in batches]


def _versioned_batch(row: Row) -> VersionedBatch:
    return VersionedBatch(int(row["step"]), int(row["version"]), RolloutBatch(**row["batch"]))
