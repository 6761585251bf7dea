"""The engines section of the run configuration (`engines.*`): which engines train and sample,
their settings, and the checks across them (a section of flows/config.py's tree, in its own
module as the cluster and tracking sections are)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from grpo_core.engines.config import DeepSpeedConfig, HFSettings, TrainWorkersConfig, VLLMSettings
from grpo_core.engines.registry import (
    IN_PROCESS_ENGINE,
    ROLLOUT_ENGINES,
    TRAIN_ENGINES,
    RolloutCapabilities,
)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)


class EnginesSection(_Section):
    """Which engines do the work: training (GRPO update, reward models) and sampling (rollout,
    labelling, evaluation, GRPO), by their names in grpo_core/engines/registry.py; an engine's
    settings are the section of its name. Defaults: plain torch and HF transformers."""

    train: str = Field(
        "torch",
        description="Training engine of the GRPO update and the reward models: torch (one "
        "process, CPU or one GPU) or deepspeed (ZeRO 0-3, bf16; needs the gpu extra: pip "
        "install -e '.[gpu]'). With deepspeed.processes_per_node > 1 or a hostfile each GRPO "
        "update runs on that many processes through the deepspeed launcher. Warm start (SFT) "
        "always uses torch.",
        json_schema_extra=TRAIN_ENGINES.json_schema,
    )
    rollout: str = Field(
        "hf",
        description="Sampling engine of the rollout, labelling, evaluation and (see "
        "vllm.in_grpo) GRPO stages: hf (transformers in process, our decode loop), "
        "hf_generate (the same, decoded by transformers' generate: for a model the hf loop "
        "cannot drive; same draws, slower) or vllm (a worker in its own environment: "
        "`make vllm-env`).",
        json_schema_extra=ROLLOUT_ENGINES.json_schema,
    )
    deepspeed: DeepSpeedConfig = Field(
        default_factory=DeepSpeedConfig,
        description="DeepSpeed settings when train = deepspeed: ZeRO stage, bf16, processes.",
    )
    vllm: VLLMSettings = Field(
        default_factory=VLLMSettings, description="vLLM worker settings when rollout = vllm."
    )
    hf: HFSettings = Field(
        default_factory=HFSettings,
        description="Decoding of the in-process engines (rollout = hf or hf_generate, and the "
        "GRPO stage's sampling on its own model): KV cache and compiled decode step.",
    )
    train_workers: Literal["none", "ray"] = Field(
        "none",
        description="Where the GRPO update runs: none (in the stage's process, or one "
        "deepspeed launcher job per step with deepspeed.processes_per_node > 1 or a hostfile) "
        "or ray (engines.workers.ranks Ray actors kept for the run or each GRPO stage "
        "(engines.workers.lifetime), each one rank of a gloo/NCCL group running "
        "engines.train: deepspeed, or torch with DDP; fed each step's batch through Ray's "
        "object store). Ray: cluster.ray_address, else a local Ray on 127.0.0.1 started with "
        "the ranks and stopped with them (the ray extra).",
    )
    workers: TrainWorkersConfig = Field(
        default_factory=TrainWorkersConfig,
        description="The ranks of train_workers = ray: how many, CPUs and GPUs per rank.",
    )

    @field_validator("train")
    @classmethod
    def _registered_train_engine(cls, name: str) -> str:
        return TRAIN_ENGINES.check(name)

    @field_validator("rollout")
    @classmethod
    def _registered_rollout_engine(cls, name: str) -> str:
        return ROLLOUT_ENGINES.check(name)

    def settings_of(self, engine: str) -> BaseModel | None:
        """The settings section of engine `engine` (engines.<name>, or the section a rollout
        engine declares it shares), None if it has none."""
        if engine in ROLLOUT_ENGINES:
            engine = ROLLOUT_ENGINES[engine].settings_section or engine
        settings = getattr(self, engine, None)
        return settings if isinstance(settings, BaseModel) else None

    def rollout_capabilities(self, engine: str) -> RolloutCapabilities:
        """What rollout engine `engine` does besides sampling, as it declares for its settings."""
        return ROLLOUT_ENGINES[engine].capabilities(self.settings_of(engine))

    @property
    def grpo_rollout(self) -> str:
        """The engine the GRPO stage samples with: engines.rollout when it declares it samples
        inside GRPO (vLLM unless vllm.in_grpo: false), else HF on the stage's model."""
        inside = self.rollout_capabilities(self.rollout).samples_in_grpo
        return self.rollout if inside else IN_PROCESS_ENGINE

    @model_validator(mode="after")
    def _one_way_to_many_ranks(self) -> EnginesSection:
        ds = self.deepspeed
        if self.train_workers == "ray" and (ds.processes_per_node > 1 or ds.hostfile):
            raise ValueError(
                "engines.train_workers = ray places its ranks with engines.workers.ranks, not "
                "the deepspeed launcher: leave engines.deepspeed.processes_per_node at 1 and "
                "engines.deepspeed.hostfile empty (or set train_workers: none to launch)"
            )
        if self.workers.reward_models and self.train_workers != "ray":
            raise ValueError(
                "engines.workers.reward_models = true trains the reward models on the training "
                "ranks, which engines.train_workers = none does not start: set "
                "engines.train_workers: ray, or reward_models: false"
            )
        return self

    @property
    def launched(self) -> bool:
        """True when GRPO updates go through the deepspeed launcher (several processes)."""
        ds = self.deepspeed
        launcher = ds.processes_per_node > 1 or bool(ds.hostfile)
        return self.train == "deepspeed" and self.train_workers == "none" and launcher

    @property
    def updates_in_process(self) -> bool:
        """True when the GRPO update runs in the stage's process (which then holds the
        reference); False for launcher jobs and Ray workers, which load their own."""
        return not self.launched and self.train_workers == "none"
