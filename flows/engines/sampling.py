"""Sampling engines from `engines.rollout`: HFRolloutEngine on the model in memory, or the
run's vLLM worker (one per process, started at the first vLLM stage) loaded with the stage's
policy checkpoint; and the GRPO stage's sampler, which with vLLM gives the worker the updated
policy before each step that follows an update (in memory, or through a scratch checkpoint)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from torch import Tensor
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.config import ItergrpoConfig
from flows.engines.availability import vllm_python_path
from flows.engines.ray_shards import sharded_engine
from flows.model_io import save_model
from flows.names import POLICY
from flows.progress import log
from flows.stage_io import ckpt
from grpo_core.contracts.rollout import RolloutBatch, RolloutEngine, SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine
from storage.run_writer import RunWriter

Purpose = Literal["rollout", "label", "evaluate", "grpo"]

# Checkpoint role (checkpoints/<run_id>/<role>/iter-<k>/) of the GRPO stage's scratch policy.
VLLM_SYNC = "grpo-vllm-sync"  # the policy the vLLM worker reloads between GRPO steps


def _dir_identity(path: Path) -> tuple[str, int, int]:
    """Checkpoints are renamed into place: a rewrite changes the directory's inode/mtime."""
    stat = os.stat(path)
    return (str(path), stat.st_ino, stat.st_mtime_ns)


class SharedVLLMWorker:
    """The one vLLM worker of this process, reused by every stage of a run.

    Starting vLLM costs 20-60 s; reloading a checkpoint of the same architecture costs about
    the time to read its weights. So the worker starts at the first vLLM stage of a run and
    later stages (another policy checkpoint) and GRPO steps (the policy being trained) reload
    weights into it. A different run or different vLLM options start a new worker (one at a
    time); execute_run closes it when the run ends, and the engine's finalizer at exit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._engine: Any = None
        self._key: tuple[Any, ...] | None = None
        self._loaded: tuple[str, int, int] | None = None  # weights now in the worker
        self.reload_seconds: list[float] = []

    def engine(
        self, cfg: ItergrpoConfig, run: RunWriter, checkpoint_dir: Path, prefix_caching: bool
    ) -> Any:
        """A VLLMRolloutEngine holding the weights of checkpoint_dir (started or reloaded)."""
        from grpo_core.engines.vllm_rollout import VLLMRolloutEngine

        v = cfg.engines.vllm
        llm_kwargs: dict[str, Any] = {
            "enable_prefix_caching": prefix_caching,
            "gpu_memory_utilization": v.gpu_memory_utilization,
            "enforce_eager": v.enforce_eager,
        }
        if v.max_model_len is not None:
            llm_kwargs["max_model_len"] = v.max_model_len
        llm_kwargs.update(v.llm_kwargs)
        env = {"VLLM_CPU_KVCACHE_SPACE": str(v.cpu_kv_cache_gib), **v.env}
        python = vllm_python_path(cfg)
        key = (
            str(run.store.root),
            run.run_id,
            str(python),
            v.dtype,
            cfg.run.seed,
            json.dumps(llm_kwargs, sort_keys=True),
            json.dumps(env, sort_keys=True),
        )
        with self._lock:
            if self._engine is not None and key != self._key:
                self._close()
            if self._engine is None:
                log_dir = run.store.run_dir(run.run_id) / "logs"
                log_dir.mkdir(parents=True, exist_ok=True)
                log_path = log_dir / "vllm-worker.log"
                log.info("starting the vLLM worker on %s (log: %s)", checkpoint_dir, log_path)
                self._engine = VLLMRolloutEngine(
                    checkpoint_dir,
                    dtype=v.dtype,
                    seed=cfg.run.seed,
                    llm_kwargs=llm_kwargs,
                    python=python,
                    env=env,
                    log_path=log_path,
                )
                self._key, self._loaded = key, _dir_identity(checkpoint_dir)
                log.info(
                    "vLLM %s worker ready in %.1f s",
                    self._engine.vllm_version,
                    self._engine.start_seconds,
                )
            elif self._loaded != _dir_identity(checkpoint_dir):
                self._reload(checkpoint_dir)
            return self._engine

    def reload(self, checkpoint_dir: Path) -> float:
        """Load checkpoint_dir's weights into the running worker; the seconds it took."""
        with self._lock:
            if self._engine is None:
                raise RuntimeError("no vLLM worker is running: call engine() first")
            return self._reload(checkpoint_dir)

    def running(self) -> Any:
        """The running worker's engine, whatever weights it holds."""
        if self._engine is None:
            raise RuntimeError("no vLLM worker is running: call engine() first")
        return self._engine

    def push(self, weights: dict[str, Tensor], timeout_s: float) -> tuple[float, int]:
        """Send weights to the running worker in memory; (seconds, bytes). The worker then
        holds no checkpoint's weights, so the next engine() call reloads from disk."""
        with self._lock:
            if self._engine is None:
                raise RuntimeError("no vLLM worker is running: call engine() first")
            start = time.perf_counter()
            sent = int(self._engine.update_weights(weights, timeout_s))
            self._loaded = ("memory", 0, time.monotonic_ns())
            return time.perf_counter() - start, sent

    def _reload(self, checkpoint_dir: Path) -> float:
        seconds = float(self._engine.reload(checkpoint_dir))
        self._loaded = _dir_identity(checkpoint_dir)
        self.reload_seconds.append(seconds)
        return seconds

    def close(self) -> None:
        """Stop the worker, if one runs."""
        with self._lock:
            self._close()

    def _close(self) -> None:
        if self._engine is not None:
            self._engine.close()
        self._engine = self._key = self._loaded = None


VLLM_WORKER = SharedVLLMWorker()


def close_rollout_engines() -> None:
    """Stop engine processes kept between stages (the vLLM worker); the run's end calls it."""
    VLLM_WORKER.close()


def build_rollout_engine(
    cfg: ItergrpoConfig,
    run: RunWriter,
    policy_iteration: int,
    purpose: Purpose,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    show_progress: bool = True,
) -> RolloutEngine:
    """The sampler of a stage for policy_{policy_iteration} (`model`, saved in the store).

    hf: HFRolloutEngine on `model`. vllm: the shared worker holding that checkpoint's weights
    (labelling always with prefix caching: each step prefix is shared by N completions).
    """
    if cfg.engines.rollout == "hf":
        return HFRolloutEngine(
            model,
            tokenizer,
            batch_size=batch_size,
            show_progress=show_progress,
            progress_label=purpose,
        )
    checkpoint_dir = ckpt(cfg, run.run_id, POLICY, policy_iteration)
    prefix_caching = True if purpose == "label" else cfg.engines.vllm.prefix_caching
    engine: RolloutEngine = VLLM_WORKER.engine(cfg, run, checkpoint_dir, prefix_caching)
    return engine


def stage_sampler(
    cfg: ItergrpoConfig,
    run: RunWriter,
    policy_iteration: int,
    purpose: Purpose,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    batch_size: int,
    shard_label: str | None = None,
) -> RolloutEngine:
    """What a stage samples policy_{policy_iteration} with: Ray shards when
    cluster.ray_address is set (labelled `shard_label`, default `purpose`), else the
    in-process engine of build_rollout_engine."""
    label = shard_label or purpose
    sharded = sharded_engine(cfg, run.run_id, policy_iteration, model, batch_size, label)
    return sharded or build_rollout_engine(
        cfg, run, policy_iteration, purpose, model, tokenizer, batch_size
    )


class GRPOSampler:
    """The GRPO stage's sampler. HF samples from the policy in memory. vLLM (engines.rollout =
    vllm and engines.vllm.in_grpo) uses the shared worker, loaded with policy_k; before each
    step that follows a change of the weights the worker gets the policy: broadcast over a
    process group (engines.vllm.weight_sync = memory), or saved to a scratch checkpoint that
    the worker reloads (disk). The per-step cost of both is in the README."""

    def __init__(
        self,
        cfg: ItergrpoConfig,
        run: RunWriter,
        iteration: int,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        weights: Callable[[], dict[str, Tensor] | None] = lambda: None,
    ) -> None:
        self.cfg, self.run, self.iteration = cfg, run, iteration
        self.model, self.tokenizer = model, tokenizer
        self.weights = weights  # the policy's weights to send (None: the model's own)
        self.uses_vllm = cfg.engines.rollout == "vllm" and cfg.engines.vllm.in_grpo
        self.hf = HFRolloutEngine(
            model, tokenizer, batch_size=cfg.rollout.batch_size, show_progress=False
        )
        self.current_dir = ckpt(cfg, run.run_id, POLICY, iteration)  # holds the model's weights
        self.stale = False  # the model's weights changed since the worker got them
        self.sync_dir = ckpt(cfg, run.run_id, VLLM_SYNC, iteration)
        self.sync_seconds: list[tuple[float, float]] = []  # (save, load) per sync; memory: (0, s)
        self.sync_bytes: list[int] = []  # bytes sent per in-memory sync
        self.pushed = False  # the worker holds weights sent in memory by this sampler

    def weights_changed(self) -> None:
        """The policy in memory was updated (or resumed): resync vLLM before sampling."""
        self.stale = True

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        if not self.uses_vllm:
            return self.hf.generate(prompts, n, params, seed=seed)
        v = self.cfg.engines.vllm
        if v.weight_sync == "memory" and self.stale:
            if not self.pushed:  # the worker runs (started or reloaded with policy_k)
                VLLM_WORKER.engine(self.cfg, self.run, self.current_dir, v.prefix_caching)
            state = self.weights() or dict(self.model.state_dict())
            seconds, sent = VLLM_WORKER.push(state, v.sync_timeout_s)
            self.pushed, self.stale = True, False
            self.sync_seconds.append((0.0, seconds))
            self.sync_bytes.append(sent)
            log.info("vLLM weight sync in memory: %.3f s, %.1f MB", seconds, sent / 1e6)
        if self.pushed:
            return self._sample(VLLM_WORKER.running(), prompts, n, params, seed)
        start, synced = time.perf_counter(), self.stale
        if synced:  # disk: write the current policy for the worker to reload
            save_model(self.sync_dir, self.model, self.tokenizer, self.weights())
            self.current_dir, self.stale = self.sync_dir, False
        saved = time.perf_counter()
        engine = VLLM_WORKER.engine(self.cfg, self.run, self.current_dir, v.prefix_caching)
        if synced:
            done = time.perf_counter()
            self.sync_seconds.append((saved - start, done - saved))
            log.info("vLLM weight sync: save %.3f s + reload %.3f s", saved - start, done - saved)
        return self._sample(engine, prompts, n, params, seed)

    @staticmethod
    def _sample(
        engine: Any, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        batch: RolloutBatch = engine.generate(prompts, n, params, seed=seed)
        return batch

    def close(self) -> None:
        """Drop the scratch checkpoint (the worker stays for the next stage)."""
        shutil.rmtree(self.sync_dir, ignore_errors=True)
