"""Scale-out with Ray: the sampling of the rollout, labelling and evaluation stages as Ray
tasks over batch-aligned slices of each call's rows, merged back in order. Why the committed
rows equal an unsharded run's, and why plain `ray.remote`: docs/ray_shards.md."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.cluster_config import ClusterSection
from flows.model_io import to_device
from flows.progress import log
from flows.runtime import apply_threads, resolve_device
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.sharded_rollout import even_shards, merge_batches
from grpo_core.model.policy import load_policy

__all__ = [
    "RayShardedRollout",
    "ShardJob",
    "batch_aligned_shards",
    "connect_ray",
    "merge_batches",
    "ray_runner",
    "ray_sharded_rollout",
    "run_shard",
    "run_shards_in_process",
]


@dataclass(frozen=True)
class ShardJob:
    """Rows start..stop-1 of one `generate(prompts, n, params, seed)` call, sampled by the
    policy checkpoint at policy_dir with `batch_size` rows per forward pass, on `device`
    (run.device) with `threads` torch threads. copy_weights: move the loaded (memory-mapped)
    weights into torch memory, as the stage's model is."""

    device: str
    dtype: str  # policy.dtype
    threads: int | None
    policy_dir: str
    batch_size: int
    n: int
    params: SamplingParams
    seed: int
    start: int
    stop: int
    copy_weights: bool = False
    attn_implementation: str | None = None  # policy.attn_implementation


# (prompts, jobs) -> one batch per job, in job order.
ShardRunner = Callable[[list[str], list[ShardJob]], list[RolloutBatch]]


def batch_aligned_shards(total_rows: int, batch_size: int, shards: int) -> list[tuple[int, int]]:
    """Contiguous row ranges covering 0..total_rows-1, each a whole number of batches (the
    last may end short), as equal as batches allow; at most `shards`, none empty."""
    if batch_size < 1 or shards < 1:
        raise ValueError(f"batch_size and shards must be >= 1 (got {batch_size}, {shards})")
    batches = -(-total_rows // batch_size)
    return [
        (first * batch_size, min(end * batch_size, total_rows))
        for first, end in even_shards(batches, shards)
    ]


# Worker side: the last policy loaded, keyed by its directory's identity, reused by the next
# shard of the same checkpoint in this worker process (evaluation samples twice per policy).
_LOADED: dict[tuple[Any, ...], tuple[PreTrainedModel, PreTrainedTokenizerBase]] = {}


def _policy(job: ShardJob) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    path = Path(job.policy_dir)
    stat = os.stat(path)  # checkpoints are renamed into place: a rewrite changes inode/mtime
    key = (
        *(str(path), stat.st_ino, stat.st_mtime_ns),
        *(job.device, job.dtype, job.copy_weights, job.attn_implementation),
    )
    if key not in _LOADED:
        _LOADED.clear()
        model, tokenizer = load_policy(path, job.dtype, attn_implementation=job.attn_implementation)
        if job.copy_weights:
            with torch.no_grad():
                for param in model.parameters():  # tied weights are one Parameter: copied once
                    param.data = param.data.clone()
        _LOADED[key] = (to_device(model, resolve_device(job.device)), tokenizer)
    return _LOADED[key]


def run_shard(prompts: list[str], job: ShardJob) -> RolloutBatch:
    """One shard, where it runs (a Ray worker, or this process for `run_shards_in_process`)."""
    apply_threads(job.threads)
    model, tokenizer = _policy(job)
    engine = HFRolloutEngine(model, tokenizer, batch_size=job.batch_size, show_progress=False)
    return engine.generate(prompts, job.n, job.params, job.seed, rows=(job.start, job.stop))


def run_shards_in_process(prompts: list[str], jobs: list[ShardJob]) -> list[RolloutBatch]:
    """The shards one after another in this process (no Ray): the split without the cluster."""
    return [run_shard(prompts, job) for job in jobs]


def _import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise RuntimeError(
            "cluster.ray_address is set but ray is not installed: pip install -e '.[ray]'"
        ) from exc
    return ray


def connect_ray(cluster: ClusterSection) -> Any:
    """The `ray` module, initialised: an already initialised Ray (e.g. by a test or a user
    script) is used as it is, else `ray.init(address=cluster.ray_address)`, where 'local'
    starts a Ray on this machine and 'auto' joins the one `ray start` set up."""
    ray = _import_ray()
    if not ray.is_initialized():
        log.info("connecting to Ray at %s", cluster.ray_address)
        ray.init(address=cluster.ray_address)
    return ray


def ray_runner(cluster: ClusterSection, name: str) -> ShardRunner:
    """Shards as Ray tasks with the cluster's resource annotations, results in job order."""

    def run(prompts: list[str], jobs: list[ShardJob]) -> list[RolloutBatch]:
        ray = connect_ray(cluster)
        task = ray.remote(run_shard)
        prompts_ref = ray.put(prompts)  # stored once, shared by every shard of the call
        refs = [
            task.options(
                num_cpus=cluster.num_cpus_per_shard,
                num_gpus=cluster.num_gpus_per_shard,
                name=f"{name}-shard{i}",
            ).remote(prompts_ref, job)
            for i, job in enumerate(jobs)
        ]
        return list(ray.get(refs))

    return run


class RayShardedRollout:
    """`RolloutEngine` whose `generate` runs batch-aligned slices of the call's rows as shards
    (Ray tasks, each loading the policy from its checkpoint; or one after another in this
    process) and returns the merged batch: the same batch the in-process HF engine returns.
    (Not grpo_core's PromptShardedEngines, which splits prompts over engines kept for the
    run.)"""

    def __init__(
        self,
        cluster: ClusterSection,
        device: str,
        dtype: str,
        threads: int | None,
        policy_dir: Path,
        batch_size: int,
        runner: ShardRunner,
        name: str = "generate",
        copy_weights: bool = False,
        attn_implementation: str | None = None,
    ) -> None:
        self.shards, self.device, self.dtype, self.threads = cluster.shards, device, dtype, threads
        self.policy_dir, self.batch_size = policy_dir, batch_size
        self.runner, self.name, self.copy_weights = runner, name, copy_weights
        self.attn_implementation = attn_implementation

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        if n < 1:
            raise ValueError(f"n (samples per prompt) must be >= 1 (got {n})")
        total = len(prompts) * n
        bounds = batch_aligned_shards(total, self.batch_size, self.shards)
        jobs = [
            ShardJob(
                self.device,
                self.dtype,
                self.threads,
                str(self.policy_dir),
                self.batch_size,
                n,
                params,
                seed,
                a,
                b,
                self.copy_weights,
                self.attn_implementation,
            )
            for a, b in bounds
        ]
        log.info("%s: %d rows in %d shards of %s", self.name, total, len(jobs), bounds)
        batch = merge_batches(self.runner(prompts, jobs) if jobs else [])
        if batch.prompt_index != [r // n for r in range(total)]:
            raise RuntimeError(f"{self.name}: shards returned rows out of order or missing")
        return batch


def ray_sharded_rollout(
    cluster: ClusterSection,
    device: str,
    dtype: str,
    threads: int | None,
    policy_dir: Path,
    policy_iteration: int,
    model: PreTrainedModel,
    batch_size: int,
    name: str,
    attn_implementation: str | None = None,
) -> RayShardedRollout | None:
    """The Ray-sharded sampling engine of policy_{policy_iteration} (saved at policy_dir;
    `model` is the stage's copy of it), or None when `cluster.ray_address` is unset: the stage
    then samples in process, as without Ray."""
    if cluster.ray_address is None:
        return None
    label = f"{name}-policy{policy_iteration}"
    in_torch_memory = all(p.data_ptr() % 64 == 0 for p in model.parameters())
    runner = ray_runner(cluster, label)
    return RayShardedRollout(
        *(cluster, device, dtype, threads, policy_dir, batch_size, runner, label),
        copy_weights=in_torch_memory,
        attn_implementation=attn_implementation,
    )
