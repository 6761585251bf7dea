"""The run context: what every stage of one run shares besides its own config sections: the
run (id and store), checkpoint paths by role and iteration, the device, derived seeds, CPU
threads, and the run's rollout engines. The loop builds one per run and closes it at the end;
stages read the config sections they use from `ctx.cfg` and hand components typed pieces."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

from flows.config import ItergrpoConfig
from flows.engines.sampling import FiniteSampler, Purpose, RolloutEngines
from flows.names import POLICY
from flows.runtime import derive_seed, resolve_device
from storage.checkpoints import checkpoint_path
from storage.errors import MissingCheckpointError
from storage.run_writer import RunWriter
from storage.store import RunStore

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from flows.engines.train_workers import RankGroup
    from grpo_core.contracts.rollout import Sampler
    from grpo_core.data.tasks.base import Task
    from grpo_core.model.prompts import Prompter


@dataclass
class RunContext:
    """One run as its stages see it."""

    cfg: ItergrpoConfig
    store: RunStore
    run: RunWriter  # the run's open writer: stage attempts, status
    engines: RolloutEngines = field(init=False)
    _training_ranks: RankGroup | None = field(init=False, default=None)

    def __post_init__(self) -> None:
        self.engines = RolloutEngines(
            self.cfg.engines,
            policy_dtype=self.cfg.policy.dtype,
            attn_implementation=self.cfg.policy.attn_implementation,
            seed=self.cfg.run.seed,
            log_dir=self.store.run_dir(self.run_id) / "logs",
            scratch_dir=self.store.checkpoints_dir / self.run_id / "rollout-engine-sync",
            ray_address=self.cfg.cluster.ray_address,
        )

    @property
    def run_id(self) -> str:
        return self.run.run_id

    @cached_property
    def device(self) -> torch.device:
        return resolve_device(self.cfg.run.device)

    @cached_property
    def task(self) -> Task:
        """The run's task (its data validated once per run), without the rows the pre-flight
        drops (task.local_files.on_bad_rows: drop), counted in status.json as rows_dropped."""
        from flows.preflight_data import task_of_run

        task, dropped = task_of_run(self.cfg)
        if dropped is not None:
            self.run.set_status("running", rows_dropped=dropped)
        return task

    @property
    def threads(self) -> int | None:
        """torch CPU threads of the run's processes (None: torch's default)."""
        return self.cfg.run.num_threads

    def seed(self, *parts: object) -> int:
        """The seed of one random thing of the run, derived from run.seed and `parts` (stage
        name, iteration, step...)."""
        return derive_seed(self.cfg.run.seed, *parts)

    def checkpoint(self, role: str, iteration: int) -> Path:
        """checkpoints/<run_id>/<role>/iter-<iteration>/ in the run's store."""
        return checkpoint_path(self.store.root, self.run_id, role, iteration)

    def require_checkpoint(self, role: str, iteration: int) -> Path:
        """A checkpoint an earlier committed stage must have written; never silently restart."""
        path = self.checkpoint(role, iteration)
        if not (path / "config.json").is_file():
            raise MissingCheckpointError(
                f"{role}_{iteration} checkpoint missing at {path}; the stage that writes it is "
                "committed but its output is gone. Restore the directory or start a new run id."
            )
        return path

    def policy(
        self, k: int, weights: bool = True
    ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        """policy_k (the policy iteration k starts from) on the run's device, in policy.dtype
        with policy.attn_implementation; weights=False: its skeleton on the meta device (the
        training ranks hold the weights)."""
        from flows.model_io import to_device
        from grpo_core.model.policy import load_policy

        policy = self.cfg.policy
        model, tokenizer = load_policy(
            self.require_checkpoint(POLICY, k), policy.dtype, weights, policy.attn_implementation
        )
        return (to_device(model, self.device) if weights else model), tokenizer

    def prompter(self, tokenizer: PreTrainedTokenizerBase) -> Prompter:
        """The policy's input for a question: prompt.* and the task's answer instruction."""
        from grpo_core.model.prompts import Prompter

        return Prompter(tokenizer, self.cfg.prompt, self.task.answer_format.instruction)

    def sampler(
        self,
        purpose: Purpose,
        policy_iteration: int,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        batch_size: int,
        shard_label: str | None = None,
    ) -> Sampler:
        """What a stage samples policy_{policy_iteration} with (`model` is the stage's copy of
        it): Ray shards when cluster.ray_address is set (labelled `shard_label`, default
        `purpose`), else the run's rollout engine (engines.rollout). An engine that keeps its
        own processes (vLLM) is never sharded that way: it spreads itself (engines.vllm.engines
        and placement: on the cluster with placement ray)."""
        from flows.engines.ray_shards import ray_sharded_rollout

        checkpoint = self.checkpoint(POLICY, policy_iteration)
        name, cluster = self.cfg.engines.rollout, self.cfg.cluster
        where = f"the {shard_label or purpose} sampling of policy_{policy_iteration}"
        if self.ray_shards_sample:
            sharded = ray_sharded_rollout(
                cluster,
                self.cfg.run.device,
                self.cfg.policy.dtype,
                self.threads,
                checkpoint,
                policy_iteration,
                model,
                batch_size,
                shard_label or purpose,
                self.cfg.policy.attn_implementation,
            )
            if sharded is not None:
                if self.cfg.engines.hf.cache_implementation != "dynamic":
                    from grpo_core.engines.static_decode import warn_once

                    warn_once(
                        "engines.hf.cache_implementation = static does not apply to the Ray "
                        "shards (cluster.ray_address): they decode with the dynamic cache"
                    )
                return FiniteSampler(sharded, where)
        engine = self.engines.engine(name, purpose, checkpoint, model, tokenizer, batch_size)
        return FiniteSampler(engine, where)

    @property
    def ray_shards_sample(self) -> bool:
        """Whether the sampling stages run as Ray shards (cluster.ray_address set): not with
        an engine that keeps its own processes (vLLM), which spreads itself."""
        engines = self.cfg.engines
        keeps_process = engines.rollout_capabilities(engines.rollout).keeps_process
        return self.cfg.cluster.ray_address is not None and not keeps_process

    def training_ranks(self) -> RankGroup | None:
        """The run's long-lived training ranks (engines.train_workers = ray), started at the
        first GRPO stage that asks and kept until the run ends; None when they live for one
        stage (engines.workers.lifetime), or when the GRPO update does not run on them."""
        from flows.engines.train_workers import RankGroup, ranks_live_for_run

        engines, cluster = self.cfg.engines, self.cfg.cluster
        if engines.train_workers != "ray":
            return None
        if not ranks_live_for_run(engines.workers.lifetime, self.ray_shards_sample):
            return None
        if self._training_ranks is None or not self._training_ranks.ranks:  # none, or died
            self._training_ranks = RankGroup(engines.workers, self.threads, cluster.ray_address)
        return self._training_ranks

    def close(self) -> None:
        """Release what the run kept between stages: the training ranks, then the rollout
        engine's worker processes (whose local Ray, if they started it, the ranks share)."""
        try:
            if self._training_ranks is not None:
                self._training_ranks.close()
                self._training_ranks = None
        finally:
            self.engines.close()
