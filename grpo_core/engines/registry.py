"""Rollout and train engines by name (`engines.rollout`, `engines.train`), each with what it
needs installed, how it is built, and, for a rollout engine, what it can do besides sampling
(RolloutCapabilities: a worker process kept for the run or the trained model sampled in
place, sampling inside GRPO, sleeping while it trains, Ray placement, prefix caching). An
engine's settings are `engines.<name>` when the config has that section (DeepSpeedConfig,
VLLMSettings), else None.

Torch-free, so the config lists the names without importing torch: an engine's module is
imported when the engine is built.
"""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.registry import Registry
from grpo_core.engines.vllm_env import find_vllm_python
from grpo_core.model.config import AUTOCAST_DTYPES

if TYPE_CHECKING:
    from torch import nn
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

    from grpo_core.contracts.rollout import RolloutEngine
    from grpo_core.contracts.training import OptimizerSettings, TrainEngine
    from grpo_core.engines.config import DeepSpeedConfig, HFSettings, VLLMSettings


@dataclass(frozen=True)
class RolloutRequest:
    """What a stage asks of a rollout engine: to sample policy_k, saved at checkpoint_dir
    (`model`: the same policy in memory, when the stage holds it)."""

    checkpoint_dir: Path
    tokenizer: PreTrainedTokenizerBase
    model: PreTrainedModel | None = None
    batch_size: int = 256
    purpose: str = "sampling"  # the progress bar's title
    dtype: str = "float32"  # the policy's dtype (policy.dtype): an engine's own copy holds it
    attn_implementation: str | None = None  # policy.attn_implementation, for that copy too
    prefix_caching: bool = True  # share KV entries between samples of a prefix (vLLM)
    seed: int = 0  # an engine's own seed (vLLM's); each generate call still takes its own
    log_dir: Path | None = None  # where a worker process writes its log
    scratch_dir: Path | None = None  # where an engine may write weights it reloads
    show_progress: bool = True


@dataclass(frozen=True)
class RolloutCapabilities:
    """What the run does with a rollout engine besides sampling, as the engine declares it for
    its settings (`RolloutEngineSpec.capabilities`); read from here, never from the settings.

    keeps_process: it starts a process worth keeping (seconds to start): one per run, reused by
    every stage through `load`, closed when the run ends. shares_model: it samples the model
    object it is given, so the trainer's in-place update reaches it without
    `receive_weights`. samples_in_grpo: the GRPO stage samples with it when it is
    engines.rollout (else with IN_PROCESS_ENGINE on the stage's model).
    sleeps_while_training: it frees its device memory (`sleep`) once a GRPO step's outputs
    are sampled, while the update trains beside it. placed_on_ray: its workers start as Ray
    actors, so the run joins cluster.ray_address before it starts. prefix_caching: it shares
    KV entries between samples of a prefix (labelling always asks for it). reloads_updates:
    with Ray training ranks, each updated policy reaches it as a checkpoint that rank 0
    writes and it reloads (`load`), not as tensors.
    """

    keeps_process: bool = False
    shares_model: bool = False
    samples_in_grpo: bool = True
    sleeps_while_training: bool = False
    placed_on_ray: bool = False
    prefix_caching: bool = True
    reloads_updates: bool = False


def _no_capabilities(settings: Any) -> RolloutCapabilities:
    return RolloutCapabilities()


@dataclass(frozen=True)
class RolloutEngineSpec:
    """A registered rollout engine.

    build(request, settings): the engine. requires(settings): raises a SettingError naming
    the fix when the engine cannot run here (checked before any stage). capabilities(settings):
    what the run does with it besides sampling (RolloutCapabilities). settings_section: the
    engines.<section> its settings are, when another engine's (empty: its own name).
    """

    name: str
    description: str
    build: Callable[[RolloutRequest, Any], RolloutEngine]
    requires: Callable[[Any], None] = lambda settings: None
    capabilities: Callable[[Any], RolloutCapabilities] = _no_capabilities
    settings_section: str = ""


@dataclass(frozen=True)
class TrainEngineSpec:
    """A registered train engine: build(model, optimizer settings, settings) and the check
    that it can run here."""

    name: str
    description: str
    build: Callable[[nn.Module, OptimizerSettings, Any], TrainEngine]
    requires: Callable[[Any], None] = lambda settings: None


ROLLOUT_ENGINES: Registry[RolloutEngineSpec] = Registry("rollout engine")
TRAIN_ENGINES: Registry[TrainEngineSpec] = Registry("train engine")

# The engine a stage samples with on its own model when engines.rollout stays out of it.
IN_PROCESS_ENGINE = "hf"


# ---- hf --------------------------------------------------------------------------------------


def _build_hf(
    request: RolloutRequest, settings: HFSettings | None, *, decode: str = "lean"
) -> RolloutEngine:
    from grpo_core.engines.config import HFSettings
    from grpo_core.engines.hf_generate import HFGenerateEngine
    from grpo_core.engines.hf_rollout import HFRolloutEngine
    from grpo_core.engines.static_decode import StaticCacheRolloutEngine
    from grpo_core.model.policy import load_policy

    model = request.model
    if model is None:
        model = load_policy(
            request.checkpoint_dir, request.dtype, attn_implementation=request.attn_implementation
        )[0]
    decoding = settings or HFSettings()
    options: dict[str, Any] = {
        "batch_size": request.batch_size,
        "show_progress": request.show_progress,
        "progress_label": request.purpose,
    }
    if decode == "generate":
        return HFGenerateEngine(
            model,
            request.tokenizer,
            cache_implementation=decoding.cache_implementation,
            compile=decoding.compile,
            **options,
        )
    if decoding.cache_implementation == "static":
        return StaticCacheRolloutEngine(
            model, request.tokenizer, compile=decoding.compile, **options
        )
    return HFRolloutEngine(model, request.tokenizer, **options)


def _hf_capabilities(settings: HFSettings | None) -> RolloutCapabilities:
    return RolloutCapabilities(shares_model=True)


ROLLOUT_ENGINES.add(
    IN_PROCESS_ENGINE,
    RolloutEngineSpec(
        IN_PROCESS_ENGINE,
        "transformers in this process, on the stage's model (CPU or GPU), decoded by our own "
        "loop (a prompt prefilled once per group, a preallocated KV cache)",
        _build_hf,
        capabilities=_hf_capabilities,
    ),
)
ROLLOUT_ENGINES.add(
    "hf_generate",
    RolloutEngineSpec(
        "hf_generate",
        "as hf, decoded by transformers' generate: for a model whose forward the hf loop "
        "cannot drive (same draws and log-probs, slower)",
        functools.partial(_build_hf, decode="generate"),
        capabilities=_hf_capabilities,
        settings_section=IN_PROCESS_ENGINE,  # engines.hf: the same cache and compile options
    ),
)


# ---- vllm ------------------------------------------------------------------------------------


def _require_vllm(settings: VLLMSettings) -> None:
    find_vllm_python(settings.python)


def engines_sync_backend(settings: VLLMSettings) -> str:
    """engines.vllm.sync_backend as the engines take it: `auto` stays auto (NCCL when the
    sender has a GPU of its own) only for engines on GPUs of their own (Ray-placed, whole
    GPUs); engines that may share a GPU with the sender sync over gloo."""
    own_gpus = settings.placement == "ray" and settings.num_gpus_per_engine >= 1
    if settings.sync_backend == "auto" and not own_gpus:
        return "gloo"
    return settings.sync_backend


def vllm_engine_options(
    request: RolloutRequest, settings: VLLMSettings, index: int | None = None
) -> dict[str, Any]:
    """VLLMRolloutEngine's arguments for `request` (picklable: a Ray actor builds its engine
    from them); index: the engine's number in a group (its own log file and scratch folder)."""
    llm_kwargs: dict[str, Any] = {
        "enable_prefix_caching": request.prefix_caching,
        "gpu_memory_utilization": settings.gpu_memory_utilization,
        "enforce_eager": settings.enforce_eager,
    }
    if settings.max_model_len is not None:
        llm_kwargs["max_model_len"] = settings.max_model_len
    if settings.tensor_parallel_size > 1:
        llm_kwargs["tensor_parallel_size"] = settings.tensor_parallel_size
    if settings.sleep_while_training:
        llm_kwargs["enable_sleep_mode"] = True
    llm_kwargs.update(settings.llm_kwargs)
    suffix = "" if index is None else f"-{index}"
    log_path = None
    if request.log_dir is not None:
        request.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = request.log_dir / f"vllm-worker{suffix}.log"
    scratch = request.scratch_dir
    if scratch is not None and index is not None:
        scratch = scratch / f"engine{suffix}"
    return {
        "checkpoint_dir": request.checkpoint_dir,
        # a mixed policy.dtype samples in the dtype its forward passes compute in
        "dtype": AUTOCAST_DTYPES.get(request.dtype, request.dtype)
        if settings.dtype == "policy"
        else settings.dtype,
        "seed": request.seed,
        "llm_kwargs": llm_kwargs,
        "python": find_vllm_python(settings.python),
        "env": {"VLLM_CPU_KVCACHE_SPACE": str(settings.cpu_kv_cache_gib), **settings.env},
        "log_path": log_path,
        "weight_sync": settings.weight_sync,
        "sync_backend": engines_sync_backend(settings),
        "sync_timeout_s": settings.sync_timeout_s,
        "scratch_dir": scratch,
    }


class PlacedEngines(NamedTuple):
    """The member engines of a placement, started from each one's options; what to run once
    they are closed (a local Ray to stop), or None; and the address of this process that their
    workers reach for the shared weight broadcast (loopback unless they may run elsewhere)."""

    members: list[Any]
    after_close: Callable[[], None] | None
    sync_host: str = "127.0.0.1"  # weight_sync.LOOPBACK (this module imports no torch)


# engines.vllm.placement -> how the group's engines are started, and where.
VLLMPlacement = Callable[[list[dict[str, Any]], "VLLMSettings"], PlacedEngines]
VLLM_PLACEMENTS: Registry[VLLMPlacement] = Registry("vLLM engine placement")


def _vllm_processes(options: list[dict[str, Any]], settings: VLLMSettings) -> PlacedEngines:
    """Worker processes of this process, started at once (each waits for its own)."""
    from grpo_core.engines.sharded_rollout import on_all
    from grpo_core.engines.vllm_rollout import VLLMRolloutEngine

    started: list[VLLMRolloutEngine] = []

    def start(kwargs: dict[str, Any]) -> VLLMRolloutEngine:
        engine = VLLMRolloutEngine(**kwargs)
        started.append(engine)
        return engine

    try:
        return PlacedEngines(on_all(options, start), None)
    except BaseException:
        for engine in started:  # none left running by a failed start
            engine.close()
        raise


VLLM_PLACEMENTS.add("process", _vllm_processes)


def _build_vllm(request: RolloutRequest, settings: VLLMSettings) -> RolloutEngine:
    from grpo_core.engines.sharded_rollout import PromptShardedEngines
    from grpo_core.engines.static_decode import warn_once
    from grpo_core.engines.vllm_rollout import VLLMRolloutEngine

    if request.attn_implementation is not None:
        warn_once(
            f"policy.attn_implementation = {request.attn_implementation} does not apply to "
            "the vllm rollout engine: vLLM picks its own attention backend"
        )
    if settings.engines == 1 and settings.placement == "process":
        return VLLMRolloutEngine(**vllm_engine_options(request, settings))
    options = [vllm_engine_options(request, settings, i) for i in range(settings.engines)]
    placed = VLLM_PLACEMENTS[settings.placement](options, settings)
    shared = settings.sync_timeout_s if settings.weight_sync == "memory" else None
    return PromptShardedEngines(
        placed.members,
        placed.after_close,
        broadcast_timeout_s=shared,
        sync_host=placed.sync_host,
        sync_backend=engines_sync_backend(settings),
    )


def _vllm_capabilities(settings: VLLMSettings) -> RolloutCapabilities:
    return RolloutCapabilities(
        keeps_process=True,
        samples_in_grpo=settings.in_grpo,
        sleeps_while_training=settings.sleep_while_training,
        placed_on_ray=settings.placement == "ray",
        prefix_caching=settings.prefix_caching,
        reloads_updates=settings.weight_sync == "disk",
    )


ROLLOUT_ENGINES.add(
    "vllm",
    RolloutEngineSpec(
        "vllm",
        "a vLLM worker in its own environment (`make vllm-env`), kept for the whole run",
        _build_vllm,
        requires=_require_vllm,
        capabilities=_vllm_capabilities,
    ),
)


# ---- train engines ---------------------------------------------------------------------------


def _build_torch(model: nn.Module, optim: OptimizerSettings, settings: None) -> TrainEngine:
    from grpo_core.engines.train import TorchEngine

    return TorchEngine(model, optim)


def require_deepspeed(settings: DeepSpeedConfig | None = None) -> None:
    """A SettingError naming the extra to install unless deepspeed is importable here, or
    naming engines.deepspeed.hostfile when it is not a readable hostfile."""
    if settings is not None and settings.hostfile:
        check_hostfile(Path(settings.hostfile))
    if find_spec("deepspeed") is None:
        import sys

        raise SettingError(
            "engines.train = deepspeed, but deepspeed is not installed in this environment "
            f"({sys.executable}): install the gpu extra (pip install -e '.[gpu]'; `make venv` "
            "does), or set engines.train: torch"
        )


def check_hostfile(path: Path) -> None:
    """A DeepSpeed hostfile: readable, with at least one `host slots=N` line (N >= 1) and
    nothing else but blank lines and # comments."""
    where = "engines.deepspeed.hostfile"
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise SettingError(
            f"{where} {path} cannot be read ({exc.strerror}): give an existing hostfile, or "
            "leave it empty to launch on this node only"
        ) from None
    hosts = [line.split("#")[0].strip() for line in lines]
    hosts = [h for h in hosts if h]
    bad = next((h for h in hosts if not re.fullmatch(r"\S+\s+slots=[1-9]\d*", h)), None)
    if bad is not None or not hosts:
        shown = f"line {bad!r}" if bad is not None else "no host line"
        raise SettingError(
            f"{where} {path}: {shown}; each line must read 'HOST slots=N' (N >= 1), e.g. "
            "'worker-1 slots=8'"
        )


def _build_deepspeed(
    model: nn.Module, optim: OptimizerSettings, settings: DeepSpeedConfig
) -> TrainEngine:
    """DeepSpeed in this process (one rank); several ranks are the launched GRPO updater's."""
    require_deepspeed(settings)
    # DeepSpeed picks its accelerator once, when first imported: name the model's device.
    os.environ.setdefault("DS_ACCELERATOR", next(model.parameters()).device.type)
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    one_process = settings.model_copy(update={"processes_per_node": 1, "hostfile": None})
    return DeepSpeedEngine(model, optim, config=one_process)


TRAIN_ENGINES.add(
    "torch", TrainEngineSpec("torch", "plain PyTorch, one process, CPU or one GPU", _build_torch)
)
TRAIN_ENGINES.add(
    "deepspeed",
    TrainEngineSpec(
        "deepspeed",
        "DeepSpeed ZeRO 0-3 and bf16 (the gpu extra)",
        _build_deepspeed,
        requires=require_deepspeed,
    ),
)
