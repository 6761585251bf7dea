"""Engines chosen by `config.engines`: the training engine and the sampling (rollout) engine.

The stages ask this module for their engines instead of constructing them, so a config
switch moves the whole pipeline between torch and DeepSpeed training, and between the HF
and vLLM samplers, with the same loss, loop and rows:

- `build_train_engine` / `build_policy_engine` / `build_rm_engine`: TorchEngine, or the
  in-process DeepSpeedEngine (one process, ZeRO 0-3, bf16).
- `build_policy_updater`: what the GRPO stage calls each step: grpo_update on an in-process
  engine, or (several DeepSpeed processes) one launcher job per step exchanging files under
  the run's checkpoint area, its output streamed into the stage's log.
- `build_rollout_engine`: HFRolloutEngine on the model in memory, or the run's vLLM worker
  (one per process, started at the first vLLM stage) loaded with the stage's policy
  checkpoint; `close_rollout_engines` stops it at the end of the run.
- `GRPOSampler`: the GRPO stage's sampler; with vLLM it saves the policy and reloads it into
  the worker before each step that follows an update.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
from collections.abc import Callable
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Literal, Protocol

import torch
from safetensors.torch import load_file
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.config import ItergrpoConfig
from flows.config_files import ConfigError
from flows.model_io import save_model
from flows.names import POLICY
from flows.progress import log
from flows.stage_io import ckpt, set_deepspeed_accelerator
from grpo_core.algo.update import grpo_update
from grpo_core.data.policy_batch import PolicyBatch
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.rollout_types import RolloutBatch, RolloutEngine, SamplingParams
from grpo_core.engines.train import TorchEngine, TrainEngine
from reward_models.models import RewardModel
from reward_models.training import rm_optimizer_settings
from storage.run_writer import RunWriter

Purpose = Literal["rollout", "label", "evaluate", "grpo"]

# Checkpoint roles (checkpoints/<run_id>/<role>/iter-<k>/) of the engines' scratch files.
VLLM_SYNC = "grpo-vllm-sync"  # the policy the vLLM worker reloads between GRPO steps
LAUNCH_JOBS = "grpo-launch"  # deepspeed launcher jobs of the GRPO stage (one per step)
DEEPSPEED_STATE = "deepspeed"  # DeepSpeed's own checkpoint inside a GRPO progress checkpoint


# ---- availability -----------------------------------------------------------------------


def _require_deepspeed() -> None:
    if find_spec("deepspeed") is None:
        raise ConfigError(
            "engines.train = deepspeed, but deepspeed is not installed in this environment "
            f"({sys.executable}): install the gpu extra (pip install -e '.[gpu]'; `make venv` "
            "does), or set engines.train: torch"
        )


def vllm_python_path(cfg: ItergrpoConfig) -> Path:
    """The vLLM environment's python, or a ConfigError naming the field and the fix."""
    from grpo_core.engines.vllm_rollout import DEFAULT_VLLM_PYTHON, PYTHON_ENV_VAR

    python = cfg.engines.vllm.python or os.environ.get(PYTHON_ENV_VAR) or DEFAULT_VLLM_PYTHON
    path = Path(python).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"engines.rollout = vllm, but the vLLM environment's python {path} does not exist: "
            "run `make vllm-env` in the repository root, set engines.vllm.python (or "
            f"${PYTHON_ENV_VAR}) to a python with vllm installed, or set engines.rollout: hf"
        )
    return path


def check_engines(cfg: ItergrpoConfig) -> None:
    """Fail before any stage runs when a selected engine is not installed here."""
    if cfg.engines.train == "deepspeed":
        _require_deepspeed()
    if cfg.engines.rollout == "vllm":
        vllm_python_path(cfg)


# ---- training engines -------------------------------------------------------------------


def build_train_engine(
    cfg: ItergrpoConfig,
    model: nn.Module,
    *,
    lr: float,
    weight_decay: float = 0.0,
    betas: tuple[float, float] = (0.9, 0.999),
    max_grad_norm: float = 1.0,
    warmup_steps: int = 0,
    lr_schedule: Literal["constant", "cosine"] = "constant",
    total_steps: int | None = None,
) -> TrainEngine:
    """engines.train on `model`: TorchEngine, or DeepSpeedEngine in this process.

    DeepSpeed here always runs one process; the launcher path (several processes) is
    build_policy_updater's, for the GRPO update only.
    """
    kwargs: dict[str, Any] = {
        "lr": lr,
        "weight_decay": weight_decay,
        "betas": betas,
        "max_grad_norm": max_grad_norm,
        "warmup_steps": warmup_steps,
        "lr_schedule": lr_schedule,
        "total_steps": total_steps,
    }
    if cfg.engines.train == "torch":
        return TorchEngine(model, **kwargs)
    _require_deepspeed()
    set_deepspeed_accelerator(cfg)
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    ds = cfg.engines.deepspeed.model_copy(update={"processes_per_node": 1, "hostfile": None})
    return DeepSpeedEngine(model, **kwargs, config=ds)


def grpo_total_steps(cfg: ItergrpoConfig) -> int:
    """Optimizer steps of one GRPO stage (the cosine schedule's length)."""
    algo = cfg.grpo.algo
    return cfg.grpo.steps * algo.mu * algo.mini_batches_per_epoch


def build_policy_engine(cfg: ItergrpoConfig, model: nn.Module) -> TrainEngine:
    """The GRPO stage's in-process engine, with the optimizer settings of grpo.algo."""
    algo = cfg.grpo.algo
    return build_train_engine(
        cfg,
        model,
        lr=algo.lr,
        weight_decay=algo.weight_decay,
        betas=(algo.adam_beta1, algo.adam_beta2),
        max_grad_norm=algo.max_grad_norm,
        warmup_steps=algo.warmup_steps,
        lr_schedule=algo.lr_schedule,
        total_steps=grpo_total_steps(cfg),
    )


def build_rm_engine(cfg: ItergrpoConfig, model: RewardModel) -> TrainEngine:
    """The engine a reward model trains with (same settings as train_reward_model's default).

    With several DeepSpeed processes configured, reward models still train in the stage's
    process (one DeepSpeed process, the configured ZeRO stage and bf16).
    """
    return build_train_engine(cfg, model, **rm_optimizer_settings(cfg.reward_models))


def trained_weights(engine: TrainEngine) -> dict[str, Tensor] | None:
    """Whole fp32 weights of a DeepSpeed-trained model (ZeRO-3 gathered, bf16 widened) for
    saving; None for a TorchEngine, whose model's own state_dict is already that."""
    full_state_dict: Callable[[], dict[str, Tensor]] | None = getattr(
        engine, "full_state_dict", None
    )
    if full_state_dict is None:
        return None
    widened: dict[int, Tensor] = {}  # by tensor identity: tied weights stay one tensor
    return {
        name: widened.setdefault(id(value), value.float() if value.is_floating_point() else value)
        for name, value in full_state_dict().items()
    }


def _plain_state(engine: TrainEngine) -> bool:
    """Whether engine.state_dict() + the model's weights resume the engine exactly (always
    for TorchEngine; DeepSpeedEngine says, else its own checkpoint directory is used)."""
    return bool(getattr(engine, "has_plain_state", True))


# ---- the GRPO update: in process or through the launcher ----------------------------------


class PolicyUpdater(Protocol):
    """One GRPO update per step on the stage's policy, and its resumable state."""

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        """grpo_update on CPU tensors (B, L); afterwards the stage's model holds the result."""
        ...

    def weights(self) -> dict[str, Tensor] | None:
        """Weights to save as the policy (None: the model's own state_dict)."""
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
        cfg: ItergrpoConfig,
        model: PreTrainedModel,
        reference: nn.Module | None,
        device: torch.device,
    ) -> None:
        self.algo = cfg.grpo.algo
        self.model = model
        self.reference = reference
        self.engine = build_policy_engine(cfg, model)
        self.device = getattr(self.engine, "device", device)
        if reference is not None:  # where the engine put the policy (DeepSpeed may move it)
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

    def weights(self) -> dict[str, Tensor] | None:
        return trained_weights(self.engine)

    def save_state(self, directory: Path) -> dict[str, Any] | None:
        if _plain_state(self.engine):
            return self.engine.state_dict()
        self.engine.save_checkpoint(directory / DEEPSPEED_STATE)  # type: ignore[attr-defined]
        return None

    def load_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        if _plain_state(self.engine):
            if state is None:
                raise ValueError(f"{directory}: no optimizer state in the GRPO checkpoint")
            self.engine.load_state_dict(state)
        else:
            self.engine.load_checkpoint(directory / DEEPSPEED_STATE)  # type: ignore[attr-defined]

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
        cfg: ItergrpoConfig,
        run: RunWriter,
        iteration: int,
        model: PreTrainedModel,
        policy_dir: Path,
    ) -> None:
        _require_deepspeed()
        self.cfg = cfg
        self.model = model
        self.reference_dir = policy_dir if cfg.grpo.algo.beta > 0 else None
        self.current_dir = policy_dir  # HF weights the next job starts from
        self.state_dir: Path | None = None  # DeepSpeed checkpoint the next job resumes
        self.root = ckpt(cfg, run.run_id, LAUNCH_JOBS, iteration)
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

        ds = self.cfg.engines.deepspeed
        step_dir = self.root / f"job-{self.jobs}"
        self.jobs += 1
        shutil.rmtree(step_dir, ignore_errors=True)  # a crashed earlier attempt's
        job = UpdateJob(
            policy_dir=str(self.current_dir),
            reference_dir=None if self.reference_dir is None else str(self.reference_dir),
            output_dir=str(step_dir / "out"),
            grpo=self.cfg.grpo.algo,
            deepspeed=ds,
            total_steps=grpo_total_steps(self.cfg),
            seed=seed,
            resume_from=None if self.state_dir is None else str(self.state_dir),
            save_state=True,
        )
        write_update_job(step_dir / "job", job, batch, advantages, old_logprobs)
        threads = self.cfg.run.num_threads or torch.get_num_threads()
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

    def weights(self) -> dict[str, Tensor] | None:
        return None  # the model in memory holds the last job's weights

    def save_state(self, directory: Path) -> dict[str, Any] | None:
        if self.state_dir is not None:
            _link_or_copy_tree(self.state_dir, directory / DEEPSPEED_STATE)
        return None

    def load_state(self, directory: Path, state: dict[str, Any] | None) -> None:
        saved = directory / DEEPSPEED_STATE
        if not saved.is_dir():
            raise FileNotFoundError(
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


def build_policy_updater(
    cfg: ItergrpoConfig,
    run: RunWriter,
    iteration: int,
    model: PreTrainedModel,
    reference: nn.Module | None,
    policy_dir: Path,
    device: torch.device,
) -> PolicyUpdater:
    """The GRPO stage's update path for engines.train and engines.deepspeed."""
    if cfg.engines.launched:
        return LaunchedUpdater(cfg, run, iteration, model, policy_dir)
    return InProcessUpdater(cfg, model, reference, device)


# ---- sampling engines -------------------------------------------------------------------


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


class GRPOSampler:
    """The GRPO stage's sampler. HF samples from the policy in memory. vLLM (engines.rollout =
    vllm and engines.vllm.in_grpo) uses the shared worker, loaded with policy_k; before each
    step that follows a change of the weights, the policy is saved to a scratch checkpoint
    and reloaded into the worker (the per-step cost documented in the README)."""

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
        self.weights = weights  # the policy's weights to save (None: the model's own)
        self.uses_vllm = cfg.engines.rollout == "vllm" and cfg.engines.vllm.in_grpo
        self.hf = HFRolloutEngine(
            model, tokenizer, batch_size=cfg.rollout.batch_size, show_progress=False
        )
        self.current_dir = ckpt(cfg, run.run_id, POLICY, iteration)  # holds the model's weights
        self.stale = False  # the model's weights changed since current_dir was written
        self.sync_dir = ckpt(cfg, run.run_id, VLLM_SYNC, iteration)
        self.sync_seconds: list[tuple[float, float]] = []  # (save, reload) per sync

    def weights_changed(self) -> None:
        """The policy in memory was updated (or resumed): resync vLLM before sampling."""
        self.stale = True

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        if not self.uses_vllm:
            return self.hf.generate(prompts, n, params, seed=seed)
        start, synced = time.perf_counter(), self.stale
        if synced:  # the worker loads checkpoints: write the current policy for it
            save_model(self.sync_dir, self.model, self.tokenizer, self.weights())
            self.current_dir, self.stale = self.sync_dir, False
        saved = time.perf_counter()
        prefix_caching = self.cfg.engines.vllm.prefix_caching
        engine = VLLM_WORKER.engine(self.cfg, self.run, self.current_dir, prefix_caching)
        if synced:
            done = time.perf_counter()
            self.sync_seconds.append((saved - start, done - saved))
            log.info("vLLM weight sync: save %.3f s + reload %.3f s", saved - start, done - saved)
        batch: RolloutBatch = engine.generate(prompts, n, params, seed=seed)
        return batch

    def close(self) -> None:
        """Drop the scratch checkpoint (the worker stays for the next stage)."""
        shutil.rmtree(self.sync_dir, ignore_errors=True)
