"""A rollout engine over several engines of one kind (engines.vllm.engines > 1),
PromptShardedEngines: each sampling call's prompts are split into contiguous shards, one per
engine, sampled at the same time, and the rows merged back in prompt order. Members seed each
row by its prompt's place in the whole batch (`prompt_offset`), so the merged batch is the one
a single engine samples.

Updated weights reach the members by one broadcast over a group that holds this process and
every member's worker (engines.vllm.weight_sync = memory), else member by member; or, from a
`WeightSource` outside this process (a long-lived training rank 0 that holds the policy), by
one broadcast from that rank straight to the workers (`receive_broadcast`): `BroadcastGroup`,
which a single VLLMRolloutEngine uses too (a group of itself)."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from torch import Tensor

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.weight_sync import (
    LOOPBACK,
    WeightSender,
    manifest,
    sync_backend,
    unique_tensors,
)

T = TypeVar("T")
R = TypeVar("R")
log = logging.getLogger(__name__)


class ShardMember(Protocol):
    """One engine of a sharded group: a RolloutEngine whose generate takes the offset of its
    prompts in the group's batch (VLLMRolloutEngine, or a Ray actor holding one)."""

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int, prompt_offset: int = 0
    ) -> RolloutBatch: ...

    def load(self, checkpoint_dir: Path) -> None: ...

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None: ...

    def sleep(self) -> None: ...

    def close(self) -> None: ...


class BroadcastMember(ShardMember, Protocol):
    """A member whose worker can join a weight-sync group that other members share
    (VLLMRolloutEngine's start_join / start_update / finish_sync), taking `sync_ranks`
    consecutive ranks of it (one per tensor-parallel rank) from the one start_join names."""

    sync_ranks: int

    def start_join(
        self, host: str, port: int, backend: str, timeout_s: float, rank: int = 1, world: int = 2
    ) -> None: ...

    def start_update(self, tensors: list[list[object]]) -> None: ...

    def finish_sync(self) -> None: ...


class WeightSource(Protocol):
    """Rank 0 of a weight-sync group in another process (a long-lived training rank): it opens
    the group's store, joins, and broadcasts the policy weights it holds."""

    def open_sync(self, world_size: int, timeout_s: float, backend: str) -> tuple[str, int, str]:
        """A store for a group of world_size ranks: its (host, port) and the backend that
        `backend` (the engines' sync_backend setting) comes to for this source."""
        ...

    def connect(self) -> None:
        """Join as rank 0 (returns once every receiver has joined)."""
        ...

    def manifest(self) -> list[list[object]]:
        """[name, dtype, shape] of the tensors `send` broadcasts, in order."""
        ...

    def send(self) -> int:
        """Broadcast the weights; the bytes sent."""
        ...


@runtime_checkable
class TakesBroadcast(Protocol):
    """A rollout engine whose workers can take weights broadcast by a WeightSource."""

    def receive_broadcast(self, source: WeightSource) -> bool: ...


def group_ranks(members: Sequence[BroadcastMember]) -> list[int]:
    """The first rank of each member in a group whose rank 0 is the sender, then the group's
    size: members take consecutive ranges of their sync_ranks."""
    firsts = [1]
    for member in members:
        firsts.append(firsts[-1] + member.sync_ranks)
    return firsts


def together(members: Sequence[BroadcastMember], collective: Callable[[], R]) -> R:
    """Our side of a collective, then every member's reply; when ours fails, a member's error
    (each answers once its own timeout passes) is the likelier cause."""
    try:
        result = collective()
    except RuntimeError:
        for member in members:
            member.finish_sync()  # raises the first worker's error, if one had one
        raise
    for member in members:
        member.finish_sync()
    return result


class BroadcastGroup:
    """The members' workers in one weight-sync group at a time: this process's (`send`: it
    broadcasts tensors it holds) or a WeightSource's (`push`: a training rank broadcasts its
    own). Each group is joined once and kept until the other kind, or another source, is
    needed (e.g. the next GRPO stage's ranks)."""

    def __init__(
        self,
        members: Sequence[BroadcastMember],
        timeout_s: float,
        backend: str = "gloo",
        host: str = LOOPBACK,
    ) -> None:
        """backend: engines.vllm.sync_backend as the engines take it (weight_sync.sync_backend);
        host: this process's address that the workers reach for its own group."""
        self.members, self.timeout_s, self.backend = list(members), timeout_s, backend
        self.host = host
        self.sender: WeightSender | None = None  # this process's group, when the workers are in it
        self.source: WeightSource | None = None  # or the source whose group they are in

    def send(self, weights: Mapping[str, Tensor]) -> int:
        """Broadcast `weights` (tied tensors once) from this process; the bytes sent."""
        tensors = unique_tensors(dict(weights))
        if not tensors:
            raise ValueError("a weight broadcast needs at least one tensor")
        if self.sender is None:
            device = next(iter(tensors.values())).device
            backend = sync_backend(self.backend, device, sender_owns_gpu=False)
            ranks = group_ranks(self.members)
            sender = WeightSender(self.timeout_s, host=self.host, world_size=ranks[-1])
            self._join(sender.host, sender.port, backend, lambda: sender.connect(backend))
            self.sender, self.source = sender, None
        sender = self.sender
        return self._broadcast(manifest(tensors), lambda: sender.send(tensors))

    def push(self, source: WeightSource) -> int:
        """The source's weights, broadcast by it into every member's worker; the bytes sent."""
        if self.source is not source:
            self.sender = self.source = None
            world = group_ranks(self.members)[-1]
            host, port, backend = source.open_sync(world, self.timeout_s, self.backend)
            self._join(host, port, backend, source.connect)
            self.source = source
        return self._broadcast(source.manifest(), source.send)

    def _join(self, host: str, port: int, backend: str, connect: Callable[[], None]) -> None:
        ranks, timeout = group_ranks(self.members), self.timeout_s
        for member, rank in zip(self.members, ranks, strict=False):
            member.start_join(host, port, backend, timeout, rank, ranks[-1])
        together(self.members, connect)

    def _broadcast(self, listed: list[list[object]], send: Callable[[], int]) -> int:
        for member in self.members:
            member.start_update(listed)
        return together(self.members, send)


def even_shards(n_items: int, n_shards: int) -> list[tuple[int, int]]:
    """[start, end) of each non-empty contiguous shard of n_items over n_shards: sizes differ
    by at most one, the longer shards first (a call's prompts over engines here; its batches
    over Ray tasks in flows/engines/ray_shards.py)."""
    if n_items < 0 or n_shards < 1:
        raise ValueError(f"need n_items >= 0 and n_shards >= 1 (got {n_items}, {n_shards})")
    size, longer = divmod(n_items, n_shards)
    bounds, start = [], 0
    for shard in range(n_shards):
        end = start + size + (1 if shard < longer else 0)
        if end > start:
            bounds.append((start, end))
        start = end
    return bounds


def merge_batches(parts: Sequence[RolloutBatch]) -> RolloutBatch:
    """The parts' batches concatenated in order (every field is a per-row list)."""
    merged = {
        f.name: [row for part in parts for row in getattr(part, f.name)]
        for f in dataclasses.fields(RolloutBatch)
    }
    return RolloutBatch(**merged)


def merge_shards(parts: Sequence[tuple[int, RolloutBatch]]) -> RolloutBatch:
    """One batch from (prompt offset, batch) parts in prompt order; each part's prompt_index is
    local to its shard and moves by its offset."""
    shifted = [
        dataclasses.replace(part, prompt_index=[offset + i for i in part.prompt_index])
        for offset, part in sorted(parts, key=lambda p: p[0])
    ]
    return merge_batches(shifted)


def on_all(members: Sequence[T], call: Callable[[T], R]) -> list[R]:
    """`call` on every member at once (each waits on its own worker), results in order; the
    first error is raised after all have finished."""
    with ThreadPoolExecutor(max_workers=max(1, len(members))) as pool:
        futures = [pool.submit(call, member) for member in members]
        return [future.result() for future in futures]


class PromptShardedEngines:
    """RolloutEngine over `members`, engines it holds for the run: generate splits each call's
    prompts into one contiguous shard per member; load and receive_weights go to every
    member; close closes them all. (Not flows' RayShardedRollout, which splits a call's rows
    over Ray tasks that each load the checkpoint.)"""

    def __init__(
        self,
        members: Sequence[ShardMember],
        after_close: Callable[[], None] | None = None,
        broadcast_timeout_s: float | None = None,
        sync_host: str = LOOPBACK,
        sync_backend: str = "gloo",
    ) -> None:
        """after_close: run once every member is closed (e.g. stop the Ray they ran on).
        broadcast_timeout_s: give weights to BroadcastMembers by one shared broadcast, each
        step waiting at most this long; None: member by member (their own weight sync).
        sync_host: this process's address that the members' workers reach for that broadcast
        (a node address when they run on other nodes). sync_backend: engines.vllm.sync_backend
        as the engines take it (weight_sync.sync_backend)."""
        if not members:
            raise ValueError("a sharded rollout engine needs at least one member engine")
        self.members, self.after_close = list(members), after_close
        self._group: BroadcastGroup | None = None
        if broadcast_timeout_s is not None:  # then the caller's members are BroadcastMembers
            takers: list[BroadcastMember] = self.members  # type: ignore[assignment]
            self._group = BroadcastGroup(takers, broadcast_timeout_s, sync_backend, sync_host)

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        bounds = even_shards(len(prompts), len(self.members))

        def sample(job: tuple[ShardMember, tuple[int, int]]) -> tuple[int, RolloutBatch]:
            member, (start, end) = job
            return start, member.generate(prompts[start:end], n, params, seed, start)

        jobs = list(zip(self.members, bounds, strict=False))  # fewer prompts than members
        return merge_shards(on_all(jobs, sample))

    def load(self, checkpoint_dir: Path) -> None:
        on_all(self.members, lambda member: member.load(checkpoint_dir))

    def sleep(self) -> None:
        """Every member sleeps until its next request (engines.vllm.sleep_while_training)."""
        on_all(self.members, lambda member: member.sleep())

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        if self._group is None:
            for member in self.members:  # each over its own sync (group, or disk reload)
                member.receive_weights(weights)
            return
        group = self._group
        self._timed("in one broadcast", lambda: group.send(weights))

    def receive_broadcast(self, source: WeightSource) -> bool:
        """The weights `source` holds, broadcast by it to every member's worker at once; False
        (nothing done) when the members sync member by member (weight_sync = disk)."""
        if self._group is None:
            return False
        group = self._group
        self._timed("broadcast by the training rank", lambda: group.push(source))
        return True

    def _timed(self, how: str, sync: Callable[[], int]) -> None:
        """Run a weight sync and log its seconds and megabytes."""
        start = time.perf_counter()
        sent = sync()
        log.info(
            "weight sync to %d engines %s: %.3f s, %.1f MB",
            len(self.members), how, time.perf_counter() - start, sent / 1e6,
        )  # fmt: skip

    @property
    def _sender(self) -> WeightSender | None:
        """This process's sync group with the workers, when they are in it."""
        return None if self._group is None else self._group.sender

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
