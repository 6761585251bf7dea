"""Settings of the engines (pydantic, shown in the Prefect form): DeepSpeed for training,
vLLM and the in-process HF engines for sampling. Each engine is handed its own settings
(`engines.<name>`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.contracts.paths import LocalPath

ZeroStage = Literal[0, 1, 2, 3]


class DeepSpeedConfig(BaseModel):
    """DeepSpeed engine settings (the `gpu` extra); optimizer and schedule come from GRPOConfig."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    zero_stage: ZeroStage = Field(
        default=2,
        description="ZeRO stage: 0 (plain data parallel), 1 (shard optimizer state), "
        "2 (also gradients) or 3 (also parameters).",
    )
    bf16: bool = Field(
        default=False,
        description="Train in bfloat16 with fp32 master weights kept by the optimizer "
        "(GPUs from Ampere on); off: fp32 everywhere.",
    )
    processes_per_node: int = Field(
        default=1,
        ge=1,
        le=1024,
        description="Processes (one per GPU) per node when launched with the deepspeed "
        "launcher, 1 to 1024; on a CPU machine each process is a CPU rank (gloo).",
    )
    hostfile: LocalPath = Field(
        default=None,
        description="DeepSpeed hostfile ('host slots=N' lines) for a multi-node launch; "
        "empty: this node only.",
    )
    master_port: int = Field(
        default=29500,
        ge=1024,
        le=65535,
        description="TCP port of rank 0 for the launched processes, 1024 to 65535.",
    )
    extra: dict[str, Any] = Field(
        default_factory=dict,
        description="Raw DeepSpeed config entries merged over the generated ones, for "
        "tuning (e.g. {'zero_optimization': {'reduce_bucket_size': 50000000}}).",
    )


class HFSettings(BaseModel):
    """Decoding of the in-process engines (engines.rollout = hf or hf_generate): the KV cache
    and whether the decode step is compiled (grpo_core/engines/static_decode.py)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    cache_implementation: Literal["dynamic", "static"] = Field(
        "dynamic",
        description="KV cache of the decode loop: dynamic (sized by the rows still decoding, "
        "finished rows leave the batch) or static (transformers' StaticCache: rows x (prompt + "
        "max_new_tokens) allocated per chunk shape and kept while the engine lives, finished "
        "rows decoded to the end; fixed shapes, so the step can be compiled). Same tokens and "
        "log-probs up to float round-off.",
    )
    compile: bool = Field(
        False,
        description="torch.compile the decode step over the static cache (needs "
        "cache_implementation: static): inductor with CUDA graphs on a GPU (mode "
        "reduce-overhead), inductor alone on CPU (hf only; hf_generate compiles on GPUs only). "
        "The first chunk of each shape pays the compile (tens of seconds).",
    )

    @model_validator(mode="after")
    def _compiled_step_needs_fixed_shapes(self) -> HFSettings:
        if self.compile and self.cache_implementation != "static":
            raise ValueError(
                "engines.hf.compile = true needs engines.hf.cache_implementation: static (a "
                "compiled decode step needs fixed shapes); set it, or compile: false"
            )
        return self


class VLLMSettings(BaseModel):
    """Options of the vLLM rollout engine (engines.rollout = vllm): a worker process running
    in vLLM's own virtual environment, fed the policy checkpoint of the stage."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    python: str = Field(
        "",
        description="Python of the vLLM environment; empty: $ITERGRPO_VLLM_PYTHON, else "
        ".venv-vllm/bin/python in the repository (built by `make vllm-env`).",
    )
    dtype: Literal["policy", "auto", "float32", "bfloat16", "float16"] = Field(
        "policy",
        description="vLLM compute dtype: policy (policy.dtype, as every other copy of the "
        "policy; bf16-mixed: bfloat16), auto (vLLM's choice: 16-bit on GPU), float32, "
        "bfloat16 or float16.",
    )
    in_grpo: bool = Field(
        True,
        description="Also sample the GRPO stage's outputs with vLLM: before each step the "
        "updated policy goes to the worker (engines.vllm.weight_sync; cost: see README). "
        "false: the GRPO stage samples with the HF engine from the policy in memory.",
    )
    weight_sync: Literal["memory", "disk"] = Field(
        "memory",
        description="How the GRPO stage gives the worker each updated policy: memory (the "
        "tensors broadcast over a trainer-worker process group, engines.vllm.sync_backend, "
        "into vLLM's weight loader; no disk) or disk (save a scratch checkpoint, the worker "
        "reloads it). Both give the same weights; see the README for their cost.",
    )
    sync_backend: Literal["auto", "gloo", "nccl"] = Field(
        "auto",
        description="The weight broadcast's backend: gloo (through host memory; always works), "
        "nccl (GPU to GPU; only when no two ranks of the group share a GPU), or auto: nccl "
        "from a Ray training rank on its own GPU to Ray-placed engines with whole GPUs "
        "(num_gpus_per_engine >= 1), gloo otherwise (NCCL refuses two ranks on one GPU).",
    )
    sleep_while_training: bool = Field(
        False,
        description="Colocation on one GPU: after each GRPO step's sampling the engines sleep "
        "(vLLM sleep mode, level 1: weights offloaded to CPU memory, KV cache freed) while the "
        "update trains beside them, and wake before the next weights or sampling. GPU only: "
        "vLLM's CPU backend has no sleep mode.",
    )
    sync_timeout_s: float = Field(
        120.0,
        gt=0.0,
        le=3600.0,
        description="Seconds the trainer and the worker wait for each other when they set up "
        "the weight-sync process group and per transfer (more than 0, at most 3600).",
    )
    prefix_caching: bool = Field(
        True,
        description="vLLM automatic prefix caching in the rollout, evaluation and GRPO stages. "
        "Math-Shepherd labelling always enables it (each step prefix is shared by its N "
        "completions).",
    )
    gpu_memory_utilization: float = Field(
        0.4,
        gt=0.0,
        le=1.0,
        description="Share of GPU memory vLLM takes for weights and KV cache, more than 0, at "
        "most 1; the rest is left to training (the GRPO stage trains beside the worker).",
    )
    max_model_len: int | None = Field(
        None,
        ge=16,
        le=1_048_576,
        description="Longest prompt + completion vLLM plans for (16 to 1048576); empty: the "
        "model's own limit.",
    )
    enforce_eager: bool = Field(
        False, description="Run vLLM without CUDA graphs/compilation (faster start, slower steps)."
    )
    cpu_kv_cache_gib: int = Field(
        2,
        ge=1,
        le=4096,
        description="KV-cache GiB on a CPU-only machine (VLLM_CPU_KVCACHE_SPACE), 1 to 4096; "
        "ignored on GPU.",
    )
    engines: int = Field(
        1,
        ge=1,
        le=256,
        description="vLLM engines, 1 to 256; more than 1 splits every sampling call's prompts "
        "over them (contiguous shards, sampled at once; the same rows as one engine) and "
        "gives each updated policy to each.",
    )
    tensor_parallel_size: int = Field(
        1,
        ge=1,
        le=64,
        description="Ranks each engine shards its model over (vLLM tensor parallelism: a "
        "process per rank, each on its own GPU; on CPU, processes sharing the cores), 1 to 64.",
    )
    placement: Literal["process", "ray"] = Field(
        "process",
        description="Where the engines run: process (worker processes of the run, sharing "
        "its devices) or ray (each engine in a Ray actor that reserves "
        "engines.vllm.num_gpus_per_engine GPUs, so Ray gives each its own; on the Ray the "
        "run already uses, else a local one).",
    )
    num_gpus_per_engine: float = Field(
        0.0,
        ge=0.0,
        le=64.0,
        description="GPUs Ray reserves per engine with placement = ray, 0 to 64: 0 on CPU, "
        "tensor_parallel_size for engines on their own GPUs, a fraction to share a GPU "
        "(with gpu_memory_utilization to match).",
    )
    num_cpus_per_engine: float = Field(
        1.0, ge=0.0, le=256.0, description="CPUs Ray reserves per engine with placement = ray."
    )
    llm_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Further vllm.LLM arguments, given as they are (e.g. {'kv_cache_dtype': "
        "'fp8'}); they override the fields above, except tensor_parallel_size and "
        "enable_sleep_mode, which the weight sync and sleep mode must know: set them through "
        "engines.vllm.tensor_parallel_size and engines.vllm.sleep_while_training.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables added to the worker's (e.g. {'VLLM_CPU_OMP_THREADS_"
        "BIND': 'nobind'} on a small shared CPU machine).",
    )

    @field_validator("llm_kwargs")
    @classmethod
    def _no_second_way_to_set_a_field(cls, kwargs: dict[str, Any]) -> dict[str, Any]:
        """TP size and sleep mode decide how many workers join the weight sync and when the
        engines sleep: given only to vLLM, the run would not know them."""
        fields = {
            "tensor_parallel_size": "engines.vllm.tensor_parallel_size",
            "enable_sleep_mode": "engines.vllm.sleep_while_training",
        }
        for key, field in fields.items():
            if key in kwargs:
                raise ValueError(
                    f"engines.vllm.llm_kwargs sets {key}, which the run must know too: remove it "
                    f"from llm_kwargs and set {field} instead"
                )
        return kwargs

    @model_validator(mode="after")
    def _gpus_cover_the_tensor_parallel_size(self) -> VLLMSettings:
        """A Ray actor sees only the GPUs it reserves: a tensor-parallel engine needs them all."""
        gpus, tp = self.num_gpus_per_engine, self.tensor_parallel_size
        if self.placement == "ray" and tp > 1 and 0 < gpus < tp:  # a fraction shares 1 GPU
            raise ValueError(
                f"engines.vllm.num_gpus_per_engine = {gpus:g} is fewer than "
                f"engines.vllm.tensor_parallel_size = {tp}: a Ray actor sees only the GPUs it "
                f"reserves; set num_gpus_per_engine to {tp}"
            )
        return self


class TrainWorkersConfig(BaseModel):
    """The long-lived training ranks of engines.train_workers = ray: how many, and what each
    reserves on the Ray cluster (docs/train_workers.md)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    ranks: int = Field(
        default=2,
        ge=1,
        le=1024,
        description="Training ranks (Ray actors, one torch.distributed rank each), 1 to 1024; "
        "every rank runs its share of each mini-batch's rows (data parallel).",
    )
    num_cpus_per_rank: float = Field(
        default=1.0,
        ge=0.0,
        le=256.0,
        description="CPUs Ray reserves for each rank (0 to 256).",
    )
    num_gpus_per_rank: int = Field(
        default=0,
        ge=0,
        le=1,
        description="GPUs Ray reserves for each rank: 0 (CPU ranks, gloo) or 1 (one GPU per "
        "rank, NCCL; needs run.device auto or cuda).",
    )
    reward_models: bool = Field(
        default=False,
        description="Also train the reward models on the ranks (data parallel: each rank a "
        "share of every mini-batch, the same mean loss and AdamW as one process) instead of in "
        "the stage's process; the examples go to the ranks through Ray's object store, rank 0 "
        "returns the trained weights.",
    )
    lifetime: Literal["auto", "run", "stage"] = Field(
        default="auto",
        description="How long the ranks live: run (started at the first GRPO stage, each "
        "later stage loads policy_k into them), stage (started and stopped by each GRPO "
        "stage), or auto: run, unless the sampling runs as Ray shards on the same Ray "
        "(cluster.ray_address without vLLM), whose tasks would wait for the CPUs/GPUs the "
        "kept ranks reserve.",
    )
    start_timeout_s: float = Field(
        default=600.0,
        gt=0.0,
        le=86400.0,
        description="Seconds to wait for the ranks to be placed, join their process group and "
        "load the policy (more than 0, at most 86400); past it the stage stops naming this "
        "field (e.g. a cluster without the CPUs/GPUs the ranks reserve).",
    )
