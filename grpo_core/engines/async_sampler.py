"""Asynchronous GRPO's sampler (grpo.async): a background thread that holds a rollout engine
and samples the next steps' batches while the current one trains, each from the policy
version the staleness bound names, the trainer handing it each new version's weights
(docs/algorithm.md section 15).

Seen from the stage it is one more rollout engine: `generate` returns the batch of the next
step (sampled ahead, or sampled again when on_stale = drop finds it too old), and
`receive_weights` hands it the policy of the step about to run. What a step's batch is depends
only on its version and seed, never on the threads' timing (on_stale = wait), and the batches
sampled ahead travel with the progress checkpoint, so a resumed stage is exact.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from torch import Tensor

from grpo_core.algo.staleness import may_sample, sampling_version, staleness_stats, within_bound
from grpo_core.algo.staleness_config import AsyncSettings
from grpo_core.contracts.rollout import RolloutBatch, RolloutEngine, SamplingParams

# Idle seconds per step (timing, not reproduced by a resume): the trainer waiting for the
# step's batch, and the sampler waiting (for weights, or for room ahead) before sampling it.
TRAINER_WAIT_SECONDS = "async_trainer_wait_seconds"
SAMPLER_WAIT_SECONDS = "async_sampler_wait_seconds"


@dataclass(frozen=True)
class SampleRequest:
    """What a step samples: its prompts, n outputs each, the parameters and the seed."""

    prompts: list[str]
    n: int
    params: SamplingParams
    seed: int


@dataclass(frozen=True)
class VersionedBatch:
    """The batch of `step`, sampled by policy version `version`."""

    step: int
    version: int
    batch: RolloutBatch


class AsyncSampler:
    """Samples ahead of the trainer on a daemon thread (started by `start`); `generate` must
    be asked for the steps' batches in order, from `first_step` on, with the request
    `plan(step)` gives (a different one is a bug: the plan and the stage disagree)."""

    def __init__(
        self,
        engine: RolloutEngine,
        plan: Callable[[int], SampleRequest],
        settings: AsyncSettings,
        *,
        first_step: int,
        steps: int,
        sampled: Sequence[VersionedBatch] = (),
    ) -> None:
        self.engine, self.plan, self.settings, self.steps = engine, plan, settings, steps
        self.first_version = first_step  # a resumed stage has no older version to give
        self._ready = {b.step: b for b in sampled}  # sampled ahead, not yet taken
        self._next = first_step + len(sampled)  # the next step the thread samples
        self._taken = first_step  # the next step whose batch the trainer takes
        self._weights: dict[int, dict[str, Tensor]] = {}  # handed on, not yet given the engine
        self._newest = 0  # the newest version handed on (0: what the engine was built with)
        self._engine_version = 0
        self._cond = threading.Condition()
        self._engine_lock = threading.Lock()  # the thread and a drop's new sample share it
        self._error: BaseException | None = None
        self._closed = False
        self._stats: dict[int, dict[str, float]] = {}
        self._idle: dict[int, float] = {}  # seconds the thread waited before each step's batch
        self._thread = threading.Thread(target=self._run, name="async-sampler", daemon=True)

    def start(self) -> AsyncSampler:
        self._thread.start()
        return self

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        """The batch of the next step; too old for the bound (on_stale = drop), it is dropped
        and the step sampled again on the newest version."""
        started = time.perf_counter()
        with self._cond:
            step = self._taken
            self._cond.wait_for(lambda: step in self._ready or self._error is not None)
            if step not in self._ready:
                self._raise_error()
            taken, idle = self._ready.pop(step), self._idle.pop(step, 0.0)
            self._taken = step + 1
            self._cond.notify_all()
        waited = time.perf_counter() - started
        request = self.plan(step)
        if request != SampleRequest(prompts, n, params, seed):
            raise RuntimeError(f"step {step} asked for another batch than its plan's")
        dropped = 0
        if not within_bound(step, taken.version, self.settings.max_staleness):
            dropped = 1
            with self._cond:
                version = self._newest
            taken = VersionedBatch(step, version, self._sample(request, version))
        self._stats[step] = {
            **staleness_stats(step, taken.version, dropped),
            TRAINER_WAIT_SECONDS: waited,
            SAMPLER_WAIT_SECONDS: idle,
        }
        return taken.batch

    def step_stats(self, step: int) -> dict[str, float]:
        """Step `step`'s staleness figures (staleness_stats) and each side's idle seconds, once
        its batch was taken; none for a step that took none (a task without train problems:
        the step is skipped before it samples)."""
        return self._stats.get(step, {})

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        """The policy the next step trains (its version: that step's index), copied: the
        trainer goes on updating its own tensors in place."""
        copied = {name: tensor.detach().clone() for name, tensor in weights.items()}
        with self._cond:
            self._weights[self._taken] = copied
            self._newest = self._taken
            self._cond.notify_all()

    def load(self, checkpoint_dir: Path) -> None:
        raise NotImplementedError(
            "the asynchronous sampler is handed each policy version as tensors "
            f"(receive_weights), not as a checkpoint to reload ({checkpoint_dir})"
        )

    def in_flight(self, next_step: int) -> list[VersionedBatch]:
        """The batches of the steps from `next_step` on that the bound lets the sampler have
        sampled already (up to max_staleness of them), waiting for them: what a progress
        checkpoint after `next_step` steps stores, so a resumed stage trains the same ones."""
        last = min(next_step + self.settings.max_staleness, self.steps)
        wanted = range(next_step, last)
        with self._cond:
            self._cond.wait_for(
                lambda: all(s in self._ready for s in wanted) or self._error is not None
            )
            if not all(s in self._ready for s in wanted):
                self._raise_error()
            return [self._ready[s] for s in wanted]

    def close(self) -> None:
        """Stop the thread (a batch being sampled is finished first); the engine stays with
        whoever built it."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    step = self._next
                    if step >= self.steps:
                        return
                    started = time.perf_counter()
                    self._cond.wait_for(functools.partial(self._may_start, step))
                    self._idle[step] = time.perf_counter() - started
                    if self._closed:
                        return
                    version = self._version_for(step)
                batch = self._sample(self.plan(step), version)
                with self._cond:
                    self._ready[step] = VersionedBatch(step, version, batch)
                    self._next = step + 1
                    self._cond.notify_all()
        except BaseException as error:  # handed to the trainer, which raises it
            with self._cond:
                self._error = error
                self._cond.notify_all()

    def _may_start(self, step: int) -> bool:
        """Closed, or the bound lets the thread sample `step` now (called under the lock)."""
        return self._closed or may_sample(
            step, self._taken, self._newest, self.settings, self.first_version
        )

    def _version_for(self, step: int) -> int:
        """The version that samples `step` (wait: the bound's; drop: the newest); the older
        versions' weights are no longer needed."""
        if self.settings.on_stale == "wait":
            version = sampling_version(step, self.settings.max_staleness, self.first_version)
        else:
            version = self._newest
        for old in [v for v in self._weights if v < version]:
            del self._weights[old]
        return version

    def _sample(self, request: SampleRequest, version: int) -> RolloutBatch:
        """`request` sampled by `version`, the engine given its weights first if it lacks them."""
        with self._engine_lock:
            if version != self._engine_version:
                with self._cond:
                    weights = self._weights[version]
                self.engine.receive_weights(weights)
                self._engine_version = version
            return self.engine.generate(request.prompts, request.n, request.params, request.seed)

    def _raise_error(self) -> None:
        """The thread's failure, where a batch it never sampled is wanted."""
        raise RuntimeError("the asynchronous sampler failed") from self._error
