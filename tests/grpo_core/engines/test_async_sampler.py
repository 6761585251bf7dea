"""The asynchronous sampler against docs/algorithm.md section 15, on a fake engine whose
outputs name the policy version that sampled them: each step's batch comes from the version
the bound names, whatever the threads' timing; a batch beyond the bound is dropped and sampled
again (on_stale = drop); the batches sampled ahead resume exactly."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path

import pytest
import torch
from torch import Tensor

from grpo_core.algo.staleness import DROPPED, POLICY_VERSION, STALENESS
from grpo_core.algo.staleness_config import AsyncSettings
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.async_sampler import (
    SAMPLER_WAIT_SECONDS,
    TRAINER_WAIT_SECONDS,
    AsyncSampler,
    SampleRequest,
    VersionedBatch,
)

PARAMS = SamplingParams(max_new_tokens=2)


class VersionEngine:
    """Samples "v<version> s<seed>": its weights are one tensor holding the version."""

    def __init__(self, fail_at_seed: int | None = None) -> None:
        self.version = 0
        self.calls: list[tuple[int, int]] = []  # (seed, version) of each batch sampled
        self.fail_at_seed = fail_at_seed
        self.sampled = threading.Semaphore(0)  # released once per batch

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        if seed == self.fail_at_seed:
            raise ValueError("engine failure")
        self.calls.append((seed, self.version))
        self.sampled.release()
        text = f"v{self.version} s{seed}"
        return RolloutBatch([0], [[1]], [[2]], [text], ["stop"], [[-float(self.version)]])

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        self.version = int(weights["version"])

    def load(self, checkpoint_dir: Path) -> None:
        raise AssertionError("not used")

    def close(self) -> None:
        pass


def plan(step: int) -> SampleRequest:
    return SampleRequest([f"prompt {step}"], 1, PARAMS, seed=100 + step)


def weights(version: int) -> dict[str, Tensor]:
    return {"version": torch.tensor(version)}


def take(sampler: AsyncSampler, step: int) -> str:
    """What the stage does at step `step`: hand on its policy (version `step`), take its batch."""
    if step > 0:
        sampler.receive_weights(weights(step))
    request = plan(step)
    return sampler.generate(request.prompts, request.n, request.params, request.seed).texts[0]


def sampler_of(
    engine: VersionEngine, k: int, on_stale: str = "wait", first: int = 0, **kw: object
) -> AsyncSampler:
    settings = AsyncSettings.model_validate({"max_staleness": k, "on_stale": on_stale})
    return AsyncSampler(engine, plan, settings, first_step=first, steps=6, **kw).start()  # type: ignore[arg-type]


@pytest.mark.parametrize("k", [1, 2, 3])
def test_step_s_trains_on_the_batch_version_s_minus_k_sampled(k: int) -> None:
    sampler = sampler_of(VersionEngine(), k)
    try:
        texts = [take(sampler, s) for s in range(6)]
        stats = [sampler.step_stats(s) for s in range(6)]
    finally:
        sampler.close()
    assert texts == [f"v{max(0, s - k)} s{100 + s}" for s in range(6)]
    assert [st[POLICY_VERSION] for st in stats] == [max(0, s - k) for s in range(6)]
    assert max(st[STALENESS] for st in stats) == k
    assert {st[DROPPED] for st in stats} == {0.0}
    assert all(st[TRAINER_WAIT_SECONDS] >= 0 and st[SAMPLER_WAIT_SECONDS] >= 0 for st in stats)


def test_the_sampler_runs_ahead_while_the_step_trains() -> None:
    """With k = 1, step 1's batch is sampled by version 0 before version 1 exists."""
    engine = VersionEngine()
    sampler = sampler_of(engine, 1)
    try:
        assert take(sampler, 0) == "v0 s100"
        ahead = sampler.in_flight(1)  # returns without any new weights
        assert [(b.step, b.version, b.batch.texts) for b in ahead] == [(1, 0, ["v0 s101"])]
        assert engine.calls == [(100, 0), (101, 0)]  # nothing beyond the bound: step 2 waits
    finally:
        sampler.close()


def test_drop_discards_a_batch_beyond_the_bound_and_samples_the_step_again() -> None:
    engine = VersionEngine()
    sampler = sampler_of(engine, 1, on_stale="drop")
    try:
        assert take(sampler, 0) == "v0 s100"
        for _ in range(3):  # steps 0, 1 and 2 sampled before version 1 is handed on
            engine.sampled.acquire()
        assert take(sampler, 1) == "v0 s101"  # staleness 1: inside the bound
        assert take(sampler, 2) == "v2 s102"  # version 0's was 2 behind: sampled again
        assert (sampler.step_stats(1)[DROPPED], sampler.step_stats(2)[DROPPED]) == (0.0, 1.0)
        assert sampler.step_stats(2)[STALENESS] == 0.0
        assert (102, 0) in engine.calls and (102, 2) in engine.calls
    finally:
        sampler.close()


def test_a_resumed_sampler_trains_on_the_stored_batches_then_samples_exactly() -> None:
    k = 2
    whole = sampler_of(VersionEngine(), k)
    try:
        want = [take(whole, s) for s in range(6)]
    finally:
        whole.close()
    first = sampler_of(VersionEngine(), k)
    try:
        before = [take(first, s) for s in range(3)]
        stored = first.in_flight(3)
    finally:
        first.close()  # the process is gone: only the stored batches and version 3 remain
    assert [(b.step, b.version) for b in stored] == [(3, 1), (4, 2)]
    resumed = sampler_of(VersionEngine(), k, first=3, sampled=stored)
    try:
        resumed.receive_weights(weights(3))  # the resumed stage hands on its policy first
        request = plan(3)
        after = [resumed.generate(request.prompts, 1, PARAMS, request.seed).texts[0]]
        after += [take(resumed, s) for s in (4, 5)]
    finally:
        resumed.close()
    assert before + after == want


def test_an_engine_error_reaches_the_trainer_with_its_cause() -> None:
    sampler = sampler_of(VersionEngine(fail_at_seed=101), 1)
    try:
        take(sampler, 0)
        with pytest.raises(RuntimeError, match="asynchronous sampler failed") as raised:
            take(sampler, 1)
        assert isinstance(raised.value.__cause__, ValueError)
    finally:
        sampler.close()


def test_a_request_other_than_the_plan_is_a_bug() -> None:
    sampler = sampler_of(VersionEngine(), 1)
    try:
        with pytest.raises(RuntimeError, match="another batch than its plan"):
            sampler.generate(["other"], 1, PARAMS, seed=100)
    finally:
        sampler.close()


def test_stored_batches_round_trip_as_rows() -> None:
    from flows.stages.grpo_async import _versioned_batch

    batch = RolloutBatch([0], [[1]], [[2, 3]], ["ab"], ["length"], [[-0.1, -1e-300]])
    row = {"step": 4, "version": 3, "batch": batch.__dict__}
    assert _versioned_batch(row) == VersionedBatch(4, 3, batch)
