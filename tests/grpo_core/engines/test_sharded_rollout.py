"""The sharded rollout engine's arithmetic (contiguous shards, merge in prompt order) and its
fan-out to members, with members that sample like vLLM's worker: each row drawn from the
call's seed and the row's place in the whole batch (prompt_offset + local index), never from
its neighbours. The same group over real vLLM workers: tests/grpo_core/engines/
test_vllm_rollout.py (needs `make vllm-env`)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import Tensor

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.sharded_rollout import (
    PromptShardedEngines,
    TakesBroadcast,
    even_shards,
    group_ranks,
    merge_shards,
)
from grpo_core.engines.weight_sync import WeightSender, manifest, unique_tensors
from tests.rollout_members import GlooReceiver, PlaceSeededEngine

PARAMS = SamplingParams(max_new_tokens=4, temperature=1.0)


def test_even_shards_by_hand() -> None:
    assert even_shards(10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert even_shards(2, 4) == [(0, 1), (1, 2)]  # fewer prompts than engines: no empty shard
    assert even_shards(0, 2) == []
    with pytest.raises(ValueError, match="n_shards >= 1"):
        even_shards(3, 0)


@given(st.integers(0, 500), st.integers(1, 40))
def test_shards_cover_the_prompts_in_order_and_differ_by_at_most_one(n: int, k: int) -> None:
    bounds = even_shards(n, k)
    assert [i for start, end in bounds for i in range(start, end)] == list(range(n))
    sizes = [end - start for start, end in bounds]
    assert len(bounds) == min(n, k) and (not sizes or max(sizes) - min(sizes) <= 1)


@given(st.lists(st.text("ab+1", min_size=1, max_size=3), max_size=12), st.integers(1, 5))
def test_a_group_samples_what_one_engine_samples(prompts: list[str], engines: int) -> None:
    one = PlaceSeededEngine().generate(prompts, 3, PARAMS, seed=7)
    members = [PlaceSeededEngine() for _ in range(engines)]
    assert PromptShardedEngines(members).generate(prompts, 3, PARAMS, seed=7) == one
    busy = [m.calls for m in members if m.calls]
    assert [call for calls in busy for call in calls] == [
        (start, end - start) for start, end in even_shards(len(prompts), engines)
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
    group = PromptShardedEngines(members, after_close=lambda: stopped.append(True))
    group.load(Path("policy_1"))
    weights = {"w": Tensor([1.0])}
    group.receive_weights(weights)
    assert all(m.loaded == [Path("policy_1")] and m.weights == [weights] for m in members)
    with pytest.raises(RuntimeError, match="worker gone"):  # reported after closing the rest
        group.close()
    assert all(m.closed for m in members) and stopped == [True]
    with pytest.raises(ValueError, match="at least one member"):
        PromptShardedEngines([])


def test_a_ray_engine_reserves_the_gpus_of_its_tensor_parallel_size() -> None:
    from pydantic import ValidationError

    from grpo_core.engines.config import VLLMSettings

    with pytest.raises(ValidationError, match="set num_gpus_per_engine to 2"):
        VLLMSettings(placement="ray", tensor_parallel_size=2, num_gpus_per_engine=1)
    assert VLLMSettings(placement="ray", tensor_parallel_size=2, num_gpus_per_engine=2)
    assert VLLMSettings(placement="ray", num_gpus_per_engine=0.5)  # a shared GPU, TP 1
    # the TP size only vLLM would see: the validator above and the sync's ranks would not
    with pytest.raises(ValidationError, match=r"set engines\.vllm\.tensor_parallel_size instead"):
        VLLMSettings(llm_kwargs={"tensor_parallel_size": 2})
    with pytest.raises(ValidationError, match=r"engines\.vllm\.sleep_while_training instead"):
        VLLMSettings(llm_kwargs={"enable_sleep_mode": True})
    assert VLLMSettings(llm_kwargs={"kv_cache_dtype": "fp8"}).llm_kwargs == {
        "kv_cache_dtype": "fp8"
    }


def test_one_broadcast_reaches_every_member_over_one_group() -> None:
    members = [GlooReceiver() for _ in range(3)]
    group = PromptShardedEngines(members, broadcast_timeout_s=30)
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


class LocalSource:
    """A WeightSource in this process (a training rank 0 stands here): its own sender."""

    def __init__(self, weights: dict[str, Tensor]) -> None:
        self.weights, self.opened = weights, 0
        self.sender: WeightSender | None = None

    def open_sync(self, world_size: int, timeout_s: float, backend: str) -> tuple[str, int, str]:
        assert backend == "gloo"  # the group's setting reaches the source
        self.opened += 1
        self.sender = WeightSender(timeout_s, world_size=world_size)
        return self.sender.host, self.sender.port, "gloo"

    def connect(self) -> None:
        assert self.sender is not None
        self.sender.connect("gloo")

    def manifest(self) -> list[list[object]]:
        return manifest(unique_tensors(self.weights))

    def send(self) -> int:
        assert self.sender is not None
        return self.sender.send(unique_tensors(self.weights))


def test_a_weight_source_broadcasts_to_every_member_joining_each_source_once() -> None:
    members = [GlooReceiver() for _ in range(2)]
    group = PromptShardedEngines(members, broadcast_timeout_s=30)
    assert isinstance(group, TakesBroadcast)
    rank_a = LocalSource({"w": torch.full((2, 2), 1.0), "b": torch.arange(3.0)})
    rank_b = LocalSource({"w": torch.full((2, 2), 2.0), "b": torch.arange(3.0) * 2})
    assert group.receive_broadcast(rank_a) and group.receive_broadcast(rank_a)
    assert group.receive_broadcast(rank_b)  # the next stage's ranks: the workers join anew
    group.receive_weights({"w": torch.full((2, 2), 3.0), "b": torch.zeros(3)})  # ours again
    assert group.receive_broadcast(rank_b)  # and back to the source's group
    assert (rank_a.opened, rank_b.opened) == (1, 2)
    for member in members:
        got = [float(r["w"][0, 0]) for r in member.received]
        assert got == [1.0, 1.0, 2.0, 3.0, 2.0]
        assert torch.equal(member.received[2]["b"], torch.arange(3.0) * 2)
    assert not PromptShardedEngines(members).receive_broadcast(rank_a)  # members sync alone


def test_members_take_consecutive_ranks_one_per_tensor_parallel_rank() -> None:
    members = [GlooReceiver() for _ in range(3)]
    for member, tp in zip(members, (2, 1, 4), strict=True):
        member.sync_ranks = tp
    assert group_ranks(members) == [1, 3, 4, 8]  # first ranks, then the group's size
    assert group_ranks([]) == [1]  # the sender alone
