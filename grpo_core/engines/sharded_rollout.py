"""A rollout engine over several engines of one kind (engines.vllm.engines > 1): each sampling
call's prompts are split into contiguous shards, one per engine, sampled at the same time,
and the rows merged back in prompt order. Members seed each row by its prompt's place in the
whole batch (`prompt_offset`), so the merged batch is the one a single engine samples."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar

from torch import Tensor

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams

T = TypeVar("T")
R = TypeVar("R")


class ShardMember(Protocol):
    """One engine of a sharded group: a RolloutEngine whose generate takes the offset of its
    prompts in the group's batch (VLLMRolloutEngine, or a Ray actor holding one)."""

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int, prompt_offset: int = 0
    ) -> RolloutBatch: ...

    def load(self, checkpoint_dir: Path) -> None: ...

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None: ...

    def close(self) -> None: ...


def shard_bounds(n_prompts: int, n_shards: int) -> list[tuple[int, int]]:
    """[start, end) of each non-empty contiguous shard of n_prompts over n_shards: sizes differ
    by at most one, the longer shards first."""
    if n_prompts < 0 or n_shards < 1:
        raise ValueError(f"need n_prompts >= 0 and n_shards >= 1 (got {n_prompts}, {n_shards})")
    size, longer = divmod(n_prompts, n_shards)
    bounds, start = [], 0
    for shard in range(n_shards):
        end = start + size + (1 if shard < longer else 0)
        if end > start:
            bounds.append((start, end))
        start = end
    return bounds


def merge_shards(parts: Sequence[tuple[int, RolloutBatch]]) -> RolloutBatch:
    """One batch from (prompt offset, batch) parts in prompt order; each part's prompt_index is
    local to its shard and moves by its offset."""
    merged = RolloutBatch([], [], [], [], [], [])
    for offset, part in sorted(parts, key=lambda p: p[0]):
        merged.prompt_index += [offset + i for i in part.prompt_index]
        merged.prompt_ids += part.prompt_ids
        merged.completion_ids += part.completion_ids
        merged.texts += part.texts
        merged.finish_reasons += part.finish_reasons
        merged.logprobs += part.logprobs
    return merged


def on_all(members: Sequence[T], call: Callable[[T], R]) -> list[R]:
    """`call` on every member at once (each waits on its own worker), results in order; the
    first error is raised after all have finished."""
    with ThreadPoolExecutor(max_workers=max(1, len(members))) as pool:
        futures = [pool.submit(call, member) for member in members]
        return [future.result() for future in futures]


class ShardedRolloutEngine:
    """RolloutEngine over `members`: generate splits the prompts over them; load and
    receive_weights go to every member; close closes them all."""

    def __init__(
        self, members: Sequence[ShardMember], after_close: Callable[[], None] | None = None
    ) -> None:
        """after_close: run once every member is closed (e.g. stop the Ray they ran on)."""
        if not members:
            raise ValueError("a sharded rollout engine needs at least one member engine")
        self.members, self.after_close = list(members), after_close

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        bounds = shard_bounds(len(prompts), len(self.members))

        def sample(job: tuple[ShardMember, tuple[int, int]]) -> tuple[int, RolloutBatch]:
            member, (start, end) = job
            return start, member.generate(prompts[start:end], n, params, seed, start)

        jobs = list(zip(self.members, bounds, strict=False))  # fewer prompts than members
        return merge_shards(on_all(jobs, sample))

    def load(self, checkpoint_dir: Path) -> None:
        on_all(self.members, lambda member: member.load(checkpoint_dir))

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        # One after another: each member's transfer is its own process group, and on one
        # device the transfers share its bandwidth anyway.
        for member in self.members:
            member.receive_weights(weights)

    def close(self) -> None:
        errors: list[Exception] = []
        for member in self.members:
            try:
                member.close()
            except Exception as err:  # close the others before reporting
                errors.append(err)
        self.members = []
        if self.after_close is not None:
            self.after_close()
            self.after_close = None
        if errors:
            raise errors[0]
