"""Settings of the training engines (pydantic, shown in the Prefect form)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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
    hostfile: str | None = Field(
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
