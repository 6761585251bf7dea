"""The sharded rollout engine's arithmetic (contiguous shards, merge in prompt order) and its
fan-out to members, with members that sample like vLLM's worker: each row drawn from the
call's seed and the row's place in the whole batch (prompt_offset + local index), never from
its neighbours. The same group over real vLLM workers: tests/grpo_core/engines/
test_vllm_rollout.py (needs `make vllm-env`)."""

from __future__ import annotations

import random
import threading
from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.sharded_rollout import ShardedRolloutEngine, merge_shards, shard_bounds
from grpo_core.engines.weight_sync import make_group

PARAMS = SamplingParams(max_new_tokens=4, temperature=1.0)


class PlaceSeededEngine:
    """Samples row (p, j) of a call from random.Random((seed, offset + p, j)): what a vLLM
    worker's per-row seeds give, here without vLLM."""

    def __init__(self, fail_close: bool = False) -> None:
        self.calls: list[tuple[int, int]] = []  # (prompt_offset, prompts) per generate
        self.loaded: list[Path] = []
        self.weights: list[Mapping[str, Tensor]] = []
        self.closed, self.fail_close = False, fail_close

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int, prompt_offset: int = 0
    ) -> RolloutBatch:
        self.calls.append((prompt_offset, len(prompts)))
        batch = RolloutBatch([], [], [], [], [], [])
        for p, prompt in enumerate(prompts):
            for j in range(n):
                rng = random.Random(f"{seed}/{prompt_offset + p}/{j}")
                ids = [rng.randrange(100) for _ in range(params.max_new_tokens)]
                batch.prompt_index.append(p)
                batch.prompt_ids.append([ord(c) for c in prompt])
                batch.completion_ids.append(ids)
                batch.texts.append(f"{prompt}:{ids}")
                batch.finish_reasons.append("length")
                batch.logprobs.append([-rng.random() for _ in ids])
        return batch

    def load(self, checkpoint_dir: Path) -> None:
        self.loaded.append(checkpoint_dir)

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        self.weights.append(weights)

    def close(self) -> None:
        self.closed = True
        if self.fail_close:
            raise RuntimeError("worker gone")


def test_shard_bounds_by_hand() -> None:
    assert shard_bounds(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert shard_bounds(2, 4) == [(0, 1), (1, 2)]  # fewer prompts than engines: no empty shard
    assert shard_bounds(0, 2) == []
    with pytest.raises(ValueError, match="n_shards >= 1"):
        shard_bounds(3, 0)


@given(st.integers(0, 500), st.integers(1, 40))
def test_shards_cover_the_prompts_in_order_and_differ_by_at_most_one(n: int, k: int) -> None:
    bounds = shard_bounds(n, k)
    assert [i for start, end in bounds for i in range(start, end)] == list(range(n))
    sizes = [end - start for start, end in bounds]
    assert len(bounds) == min(n, k) and (not sizes or max(sizes) - min(sizes) <= 1)


@given(st.lists(st.text("ab+1", min_size=1, max_size=3), max_size=12), st.integers(1, 5))
def test_a_group_samples_what_one_engine_samples(prompts: list[str], engines: int) -> None:
    one = PlaceSeededEngine().generate(prompts, 3, PARAMS, seed=7)
    members = [PlaceSeededEngine() for _ in range(engines)]
    assert ShardedRolloutEngine(members).generate(prompts, 3, PARAMS, seed=7) == one
    busy = [m.calls for m in members if m.calls]
    assert [call for calls in busy for call in calls] == [
        (start, end - start) for start, end in shard_bounds(len(prompts), engines)
    ]


def test_merge_moves_each_part_by_its_offset() -> None:
    part = RolloutBatch([0, 0, 1], [[1], [1], [2]], [[5], [6], [7]], ["a", "b", "c"],
                        ["stop", "stop", "length"], [[-0.1], [-0.2], [-0.3]])  # fmt: skip
    tail = RolloutBatch([0], [[3]], [[8]], ["d"], ["stop"], [[-0.4]])
    merged = merge_shards([(2, tail), (0, part)])  # out of order: merged by offset
    assert merged.prompt_index == [0, 0, 1, 2]
    assert merged.texts == ["a", "b", "c", "d"] and merged.logprobs[-1] == [-0.4]


def test_load_weights_and_close_reach_every_member() -> None:
    members = [PlaceSeededEngine(), PlaceSeededEngine(fail_close=True), PlaceSeededEngine()]
    stopped: list[bool] = []
    group = ShardedRolloutEngine(members, after_close=lambda: stopped.append(True))
    group.load(Path("policy_1"))
    weights = {"w": Tensor([1.0])}
    group.receive_weights(weights)
    assert all(m.loaded == [Path("policy_1")] and m.weights == [weights] for m in members)
    with pytest.raises(RuntimeError, match="worker gone"):  # reported after closing the rest
        group.close()
    assert all(m.closed for m in members) and stopped == [True]
    with pytest.raises(ValueError, match="at least one member"):
        ShardedRolloutEngine([])


def test_a_ray_engine_reserves_the_gpus_of_its_tensor_parallel_size() -> None:
    from pydantic import ValidationError

    from grpo_core.engines.config import VLLMSettings

    with pytest.raises(ValidationError, match="set num_gpus_per_engine to 2"):
        VLLMSettings(placement="ray", tensor_parallel_size=2, num_gpus_per_engine=1)
    assert VLLMSettings(placement="ray", tensor_parallel_size=2, num_gpus_per_engine=2)
    assert VLLMSettings(placement="ray", num_gpus_per_engine=0.5)  # a shared GPU, TP 1


class GlooReceiver(PlaceSeededEngine):
    """A member whose 'worker' is a thread joining the shared sync group over real gloo and
    receiving each broadcast, as a vLLM worker does."""

    def __init__(self) -> None:
        super().__init__()
        self.group: Any = None
        self.received: list[dict[str, Tensor]] = []
        self.thread: threading.Thread | None = None

    def start_join(
        self, host: str, port: int, backend: str, timeout_s: float, rank: int = 1, world: int = 2
    ) -> None:
        def join() -> None:
            store = dist.TCPStore(host, port, world, is_master=False, timeout=timedelta(seconds=30))
            self.group = make_group(store, rank, backend, timedelta(seconds=30), world)

        self.thread = threading.Thread(target=join)
        self.thread.start()

    def start_update(self, tensors: list[list[object]]) -> None:
        def receive() -> None:
            got = {}
            for name, dtype, shape in tensors:
                assert isinstance(shape, list)
                out = torch.empty(shape, dtype=getattr(torch, str(dtype)))
                self.group.broadcast(out, 0).wait()
                got[str(name)] = out
            self.received.append(got)

        self.thread = threading.Thread(target=receive)
        self.thread.start()

    def finish_sync(self) -> None:
        assert self.thread is not None
        self.thread.join(timeout=60)


def test_one_broadcast_reaches_every_member_over_one_group() -> None:
    members = [GlooReceiver() for _ in range(3)]
    group = ShardedRolloutEngine(members, broadcast_timeout_s=30)
    tied = torch.arange(6.0).reshape(2, 3)
    for step in range(2):  # the group is set up once, then reused
        weights = {"embed": tied + step, "lm_head": tied + step, "norm": torch.ones(3) * step}
        weights["lm_head"] = weights["embed"]  # tied: sent once
        group.receive_weights(weights)
    for member in members:
        assert [sorted(r) for r in member.received] == [["embed", "norm"]] * 2
        assert torch.equal(member.received[1]["embed"], tied + 1)
        assert member.weights == []  # never their own sync
    assert group._sender is not None and group._sender.world_size == 4
