"""The `cluster` config section: where sampling shards and training ranks run on Ray. Torch-
and Ray-free, like the rest of the config; checks against other sections: flows/config.py."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ClusterSection(BaseModel):
    """Scale-out: rollout, Math-Shepherd labelling and evaluation sampling split into Ray
    tasks (`pip install -e '.[ray]'`); the committed rows equal those of an in-process run."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    ray_address: str | None = Field(
        None,
        description="Ray cluster for the sampling shards (vLLM: for its engines with "
        "engines.vllm.placement = ray, instead of shards), and for the training ranks of "
        "engines.train_workers = ray. Empty: sampling in this process (training ranks and "
        "vLLM actors start a local Ray). "
        "'local': a Ray on this machine (or the one this process already started); 'auto': "
        "the cluster this machine joined with `ray start`; or 'host:6379' / 'ray://host:10001'. "
        "Shards load the policy from the store's checkpoint directories: workers must see the "
        "store path and have itergrpo installed.",
    )
    shards: int = Field(
        2,
        ge=1,
        le=1024,
        description="Ray tasks per sampling call (1 to 1024). A shard is a whole number of "
        "engine batches (rollout.batch_size or labelling.batch_size rows), so a call with "
        "fewer batches than shards runs fewer.",
    )
    num_gpus_per_shard: float = Field(
        0.0,
        ge=0.0,
        le=64.0,
        description="GPUs Ray reserves for each shard (0 to 64; 0.5 packs two shards on one "
        "GPU). 0: CPU shards (Ray hides the GPUs from them). Above 0 needs run.device auto or "
        "cuda.",
    )
    num_cpus_per_shard: float = Field(
        1.0, ge=0.0, le=256.0, description="CPUs Ray reserves for each shard (0 to 256)."
    )

    @field_validator("ray_address", mode="before")
    @classmethod
    def _known_address_form(cls, value: Any) -> Any:
        if not isinstance(value, str):
            return value
        value = value.strip()
        if not value:  # the Prefect form sends "" for a cleared field
            return None
        if value in ("local", "auto") or value.startswith("ray://"):
            return value
        if re.fullmatch(r"[^\s/]+:\d{1,5}", value):
            return value
        raise ValueError("expected empty, 'local', 'auto', 'host:port' or 'ray://host:port'")
