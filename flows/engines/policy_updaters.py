"""What the GRPO stage calls each step to update the policy: grpo_update on an in-process
TrainEngine, or (several DeepSpeed processes) one deepspeed-launcher job per step exchanging
files under the run's checkpoint area, its output streamed into the stage's log."""

from __future__ import annotations

import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import PreTrainedModel

from flows.config import GRPOStageSection
from flows.engines.train_engines import build_policy_engine, grpo_total_steps
from flows.engines_config import EnginesSection
from flows.progress import log
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.rollout import RolloutEngine
from grpo_core.contracts.training import TrainEngine
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.engines.registry import require_deepspeed
from grpo_core.model.config import AttnImplementation
from storage.errors import MissingCheckpointError

if TYPE_CHECKING:
    from flows.engines.train_workers import RankGroup

# Checkpoint roles (checkpoints/<run_id>/<role>/iter-<k>/) and directories of the updaters.
LAUNCH_JOBS = "grpo-launch"  # deepspeed launcher jobs of the GRPO stage (one per step)
DEEPSPEED_STATE = "deepspeed"  # DeepSpeed's own checkpoint inside a GRPO progress checkpoint


class PolicyUpdater(Protocol):
    """One GRPO update per step on the stage's policy, and its resumable state."""

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        """grpo_update on CPU tensors (B, L); afterwards the stage's model holds the result."""
        ...

    def hand_on(self, follower: RolloutEngine | None) -> None:
        """The policy of the last update to the engine that samples it: `follower` (one that
        does not sample the stage's model, e.g. vLLM), or, with None, the stage's model."""
        ...

    def save_weights(self, model: PreTrainedModel, directory: Path) -> None:
        """The policy of the last update as an HF checkpoint's weights and config in
        `directory`, through the stage's `model` (or, where the stage holds none of the
        weights, written by the process that holds them)."""
        ...

    def save_state(self, directory: Path) -> dict[str, Any] | None:
        """Write what the optimizer needs to resume into `directory`; returns the part that
        goes into training_state.pt (None when it lives in `directory`)."""
        ...

    def load_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        """Resume from what save_state wrote (the model's weights are already loaded)."""
        ...

    def close(self) -> None:
        """Drop scratch files."""
        ...


class InProcessUpdater:
    """grpo_update on a TrainEngine in this process (torch, or one DeepSpeed process)."""

    def __init__(
        self,
        engine: TrainEngine,
        algo: GRPOConfig,
        model: PreTrainedModel,
        reference: nn.Module | None,
    ) -> None:
        self.algo = algo
        self.model = model
        self.reference = reference
        self.engine = engine
        self.device = self.engine.device  # where the engine put the policy (DeepSpeed may move it)
        if reference is not None:  # the reference computes beside it
            reference.to(self.device)

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        dev = self.device
        old = None if old_logprobs is None else old_logprobs.to(dev)
        self.model.train()
        return grpo_update(
            self.engine,
            self.reference,
            batch.to(dev),
            advantages.to(dev),
            self.algo,
            old_logprobs=old,
            generator=torch.Generator().manual_seed(seed),
        )

    def hand_on(self, follower: RolloutEngine | None) -> None:
        if follower is not None:  # else the stage's model was trained in place
            follower.receive_weights(self.engine.full_state_dict())

    def save_weights(self, model: PreTrainedModel, directory: Path) -> None:
        model.save_pretrained(
            directory, safe_serialization=True, state_dict=self.engine.full_state_dict()
        )

    def save_state(self, directory: Path) -> dict[str, Any] | None:
        return self.engine.save_optimizer_state(directory / DEEPSPEED_STATE)

    def load_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        self.engine.load_optimizer_state(directory / DEEPSPEED_STATE, state)

    def close(self) -> None:
        pass


def stage_line_logger() -> Callable[[str], None]:
    """Where a subprocess's output lines go: the Prefect task's logger inside a Prefect run
    (shown in the UI), else the `itergrpo` logger."""
    if "prefect" in sys.modules:
        from prefect.exceptions import MissingContextError
        from prefect.logging import get_run_logger

        try:
            run_logger = get_run_logger()
        except MissingContextError:
            pass
        else:
            return lambda line: run_logger.info("deepspeed: %s", line)
    return lambda line: log.info("deepspeed: %s", line)


def _link_or_copy_tree(src: Path, dst: Path) -> None:
    """Hard links where the filesystem allows (job outputs are never modified), else copies."""

    def link(source: str, target: str) -> None:
        try:
            os.link(source, target)
        except OSError:
            shutil.copy2(source, target)

    shutil.copytree(src, dst, copy_function=link)


class LaunchedUpdater:
    """Each GRPO update as a deepspeed-launcher job of processes_per_node (x hosts) ranks.

    Step s writes checkpoints/<run>/grpo-launch/iter-<k>/step-<s>/ (job.json, the batch,
    then the ranks' output: policy/ weights, state/ DeepSpeed checkpoint, metrics.json); the
    next job starts from that policy/ and state/, so optimizer moments and the LR schedule
    carry over as in one process. The stage's in-memory model gets the new weights after
    each job (the sampler uses it). Launcher output goes to the stage's logger.
    """

    def __init__(
        self,
        grpo: GRPOStageSection,
        deepspeed: DeepSpeedConfig,
        threads: int | None,
        model: PreTrainedModel,
        policy_dir: Path,
        jobs_dir: Path,
        policy_dtype: str = "float32",
        attn_implementation: AttnImplementation | None = None,
    ) -> None:
        require_deepspeed(deepspeed)
        self.algo, self.deepspeed, self.threads = grpo.algo, deepspeed, threads
        self.policy_dtype, self.attn_implementation = policy_dtype, attn_implementation
        self.total_steps = grpo_total_steps(grpo)
        self.model = model
        self.reference_dir = policy_dir if grpo.algo.loss_reads_reference else None
        self.current_dir = policy_dir  # HF weights the next job starts from
        self.state_dir: Path | None = None  # DeepSpeed checkpoint the next job resumes
        self.root = jobs_dir
        self.on_line = stage_line_logger()
        self.jobs = 0
        self.last_step_dir: Path | None = None

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        from grpo_core.engines.deepspeed_launch import (
            POLICY_DIR,
            STATE_DIR,
            UpdateJob,
            run_update_job,
            write_update_job,
        )

        ds = self.deepspeed
        step_dir = self.root / f"job-{self.jobs}"
        self.jobs += 1
        shutil.rmtree(step_dir, ignore_errors=True)  # a crashed earlier attempt's
        job = UpdateJob(
            policy_dir=str(self.current_dir),
            reference_dir=None if self.reference_dir is None else str(self.reference_dir),
            output_dir=str(step_dir / "out"),
            grpo=self.algo,
            deepspeed=ds,
            total_steps=self.total_steps,
            seed=seed,
            policy_dtype=self.policy_dtype,
            attn_implementation=self.attn_implementation,
            resume_from=None if self.state_dir is None else str(self.state_dir),
            save_state=True,
        )
        write_update_job(step_dir / "job", job, batch, advantages, old_logprobs)
        threads = self.threads or torch.get_num_threads()
        start = time.perf_counter()
        metrics = run_update_job(
            step_dir / "job", ds, on_line=self.on_line, env={"OMP_NUM_THREADS": str(threads)}
        )
        log.info("deepspeed launcher job %s done in %.1f s", step_dir, time.perf_counter() - start)
        metrics.pop("data_parallel_size", None)
        out = step_dir / "out"
        weights = load_file(str(out / POLICY_DIR / "model.safetensors"))
        self.model.load_state_dict(weights, strict=False)  # tied weights are saved once
        if self.last_step_dir is not None:
            shutil.rmtree(self.last_step_dir, ignore_errors=True)
        self.last_step_dir = step_dir
        self.current_dir, self.state_dir = out / POLICY_DIR, out / STATE_DIR
        return metrics

    def hand_on(self, follower: RolloutEngine | None) -> None:
        if follower is not None:  # else the stage's model has the last job's weights already
            follower.receive_weights(self.model.state_dict())

    def save_weights(self, model: PreTrainedModel, directory: Path) -> None:
        # the model in memory holds the last job's weights
        model.save_pretrained(directory, safe_serialization=True)

    def save_state(self, directory: Path) -> dict[str, Any] | None:
        if self.state_dir is not None:
            _link_or_copy_tree(self.state_dir, directory / DEEPSPEED_STATE)
        return None

    def load_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        saved = directory / DEEPSPEED_STATE
        if not saved.is_dir():
            raise MissingCheckpointError(
                f"{directory}: no DeepSpeed state ({DEEPSPEED_STATE}/) in the GRPO checkpoint; "
                "was it written with another engines.train / processes setting?"
            )
        # A private copy: the progress checkpoint is replaced while the next job reads it.
        resume = self.root / "resume"
        shutil.rmtree(resume, ignore_errors=True)
        _link_or_copy_tree(directory, resume)
        self.current_dir, self.state_dir = resume, resume / DEEPSPEED_STATE

    def close(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


def stage_holds_policy_weights(engines: EnginesSection, grpo: GRPOStageSection) -> bool:
    """Whether the GRPO stage process needs policy_k's weights in memory. Not where Ray
    training ranks hold them and nothing in the stage computes with them: its sampling engine
    loads its own copy (vLLM), or it trains on gold solutions or policy_0's samples, and PPO
    (a critic started from the policy, the KL penalty from a reference) is off. (LoRA, whose
    adapters sit on the stage's model, is refused with Ray ranks.)"""
    if engines.train_workers != "ray" or grpo.algo.estimator.needs_values:
        return True
    shares_model = engines.rollout_capabilities(engines.grpo_rollout).shares_model
    return grpo.data_source == "online" and shares_model


def build_policy_updater(
    engines: EnginesSection,
    grpo: GRPOStageSection,
    threads: int | None,
    model: PreTrainedModel,
    reference: nn.Module | None,
    policy_dir: Path,
    jobs_dir: Path,
    policy_dtype: str,
    ray_address: str | None = None,
    ranks: RankGroup | None = None,
    attn_implementation: AttnImplementation | None = None,
) -> PolicyUpdater:
    """The GRPO stage's update path for engines.train and engines.deepspeed: in this process,
    through the deepspeed launcher (jobs under `jobs_dir`, ranks loading the policy in
    `policy_dtype` with `attn_implementation`) when engines.launched, or on long-lived Ray
    actors when engines.train_workers = ray (flows/engines/train_workers.py): `ranks`, the
    run's, or a group started for the stage (at `ray_address`, else a local Ray) and closed
    with it; rank 0 writes the updates that vLLM engines reload (weight_sync = disk) under
    `jobs_dir`."""
    if engines.train_workers == "ray":
        from flows.engines.train_workers import RankGroup, RayWorkersUpdater

        owns = ranks is None
        group = RankGroup(engines.workers, threads, ray_address) if ranks is None else ranks
        return RayWorkersUpdater(
            *(group, engines, grpo, model, policy_dir, policy_dtype, DEEPSPEED_STATE, owns),
            sync_dir=jobs_dir,
            attn_implementation=attn_implementation,
        )
    if engines.launched:
        return LaunchedUpdater(
            *(grpo, engines.deepspeed, threads, model, policy_dir, jobs_dir, policy_dtype),
            attn_implementation=attn_implementation,
        )
    engine = build_policy_engine(engines, grpo, model, policy_dtype)
    return InProcessUpdater(engine, grpo.algo, model, reference)
