"""vLLM engines as Ray actors (engines.vllm.placement = ray): each engine's worker process is
started and owned by a Ray actor that reserves engines.vllm.num_gpus_per_engine GPUs and
num_cpus_per_engine CPUs, so Ray gives every engine its own devices (CUDA_VISIBLE_DEVICES,
which the vLLM worker inherits). The actors live as long as the run's rollout engine; the
stage process talks to them through Ray, and each actor to its worker as the in-process
engine does (JSON lines, and a gloo/NCCL group for the weights). Registered into
grpo_core.engines.registry.VLLM_PLACEMENTS when this module is imported (flows/engines/sampling.py).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor

from flows.engines.ray_runtime import LOOPBACK, start_ray
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.config import VLLMSettings
from grpo_core.engines.registry import VLLM_PLACEMENTS, PlacedEngines


class VLLMEngineActor:
    """The body of one engine's Ray actor: a VLLMRolloutEngine built from its options."""

    def __init__(self, options: dict[str, Any]) -> None:
        from grpo_core.engines.vllm_rollout import VLLMRolloutEngine

        self.engine = VLLMRolloutEngine(**options)

    def pid(self) -> int:
        """This actor's process id (tests check where the engines run)."""
        return os.getpid()

    def node(self) -> str:
        """The Ray node this engine runs on (tests check the placement)."""
        import ray

        return str(ray.get_runtime_context().get_node_id())

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int, prompt_offset: int
    ) -> RolloutBatch:
        return self.engine.generate(prompts, n, params, seed, prompt_offset)

    def load(self, checkpoint_dir: str) -> None:
        self.engine.load(Path(checkpoint_dir))

    def receive_weights(self, weights: dict[str, Tensor]) -> None:
        self.engine.receive_weights(weights)

    def sleep(self) -> None:
        self.engine.sleep()

    def join_sync(
        self, host: str, port: int, backend: str, timeout_s: float, rank: int, world: int
    ) -> None:
        """The worker joins the stage's weight-sync group (returns once the group is up)."""
        self.engine.start_join(host, port, backend, timeout_s, rank, world)
        self.engine.finish_sync()

    def take_update(self, tensors: list[list[object]]) -> None:
        """The worker receives one broadcast of the manifest's tensors (returns when done)."""
        self.engine.start_update(tensors)
        self.engine.finish_sync()

    def close(self) -> None:
        self.engine.close()


class RayEngineMember:
    """A ShardMember (and BroadcastMember) that forwards to one VLLMEngineActor: the weights
    of a shared broadcast go from the stage process straight to the actor's worker, not
    through Ray's object store."""

    def __init__(self, ray: Any, actor: Any, sync_ranks: int = 1) -> None:
        """sync_ranks: the engine's tensor-parallel size (its ranks in a weight-sync group)."""
        self.ray, self.actor, self.sync_ranks = ray, actor, sync_ranks
        self._pending: Any = None  # the actor's reply to the last start_join / start_update

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int, prompt_offset: int = 0
    ) -> RolloutBatch:
        batch: RolloutBatch = self.ray.get(
            self.actor.generate.remote(prompts, n, params, seed, prompt_offset)
        )
        return batch

    def load(self, checkpoint_dir: Path) -> None:
        self.ray.get(self.actor.load.remote(str(checkpoint_dir)))

    def receive_weights(self, weights: Mapping[str, Tensor]) -> None:
        cpu = {name: value.detach().cpu() for name, value in weights.items()}
        self.ray.get(self.actor.receive_weights.remote(cpu))

    def sleep(self) -> None:
        self.ray.get(self.actor.sleep.remote())

    def start_join(
        self, host: str, port: int, backend: str, timeout_s: float, rank: int = 1, world: int = 2
    ) -> None:
        self._pending = self.actor.join_sync.remote(host, port, backend, timeout_s, rank, world)

    def start_update(self, tensors: list[list[object]]) -> None:
        self._pending = self.actor.take_update.remote(tensors)

    def finish_sync(self) -> None:
        pending, self._pending = self._pending, None
        self.ray.get(pending)

    def close(self) -> None:
        if not self.ray.is_initialized():  # the actor (and its worker) went with its Ray
            return
        try:
            self.ray.get(self.actor.close.remote())
        finally:
            self.ray.kill(self.actor)


def _ray_actors(options: list[dict[str, Any]], settings: VLLMSettings) -> PlacedEngines:
    """One actor per engine, started at once, on the Ray this process uses (the cluster of
    cluster.ray_address, joined by the run) or a local one, stopped after the last closes.
    The workers reach this process for the weight broadcast at its node's address."""
    ray, owns_ray = start_ray(None, len(options) * settings.num_cpus_per_engine, "vLLM engines")
    actor = ray.remote(VLLMEngineActor).options(
        num_cpus=settings.num_cpus_per_engine, num_gpus=settings.num_gpus_per_engine
    )
    handles = [actor.remote(kwargs) for kwargs in options]
    members = [
        RayEngineMember(ray, handle, int(kwargs["llm_kwargs"].get("tensor_parallel_size", 1)))
        for handle, kwargs in zip(handles, options, strict=True)
    ]
    try:
        ray.get([handle.pid.remote() for handle in handles])  # every engine up, or its error
    except BaseException:
        for handle in handles:
            ray.kill(handle)
        if owns_ray:
            ray.shutdown()
        raise
    host = LOOPBACK if owns_ray else ray.util.get_node_ip_address()
    return PlacedEngines(members, ray.shutdown if owns_ray else None, host)


VLLM_PLACEMENTS.add("ray", _ray_actors)
