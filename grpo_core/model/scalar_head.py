"""The scalar-head network that PPO's critic (grpo_core/model/critic.py) and the scalar_head
reward models (reward_models/models.py) both are: a causal-LM backbone under one
`Linear(hidden, 1)` token head (transformers' `AutoModelForTokenClassification`, one label, no
dropout), giving one scalar per token. Built here once; each owner keeps its own file marker.
"""

from __future__ import annotations

from pathlib import Path

from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    PretrainedConfig,
    PreTrainedModel,
)
from transformers.utils import logging as hf_logging

from grpo_core.contracts.errors import MissingPathError
from grpo_core.model.policy import DTYPES, attention_kwargs, reading_checkpoint


def _has_scalar_head(config: PretrainedConfig) -> bool:
    """A token classifier with one label: its head already gives one scalar per token."""
    archs = config.architectures or []
    return config.num_labels == 1 and any(a.endswith("ForTokenClassification") for a in archs)


def _scalar_head_config(config: PretrainedConfig) -> PretrainedConfig:
    """Copy of a backbone's config for one scalar per token, without dropout."""
    out = config.__class__.from_dict(config.to_dict())
    out.num_labels = 1
    out.classifier_dropout = 0.0
    out.architectures = None
    return out


def scalar_head_from_directory(
    path: Path, dtype: str, role: str, attn_implementation: str | None = None
) -> PreTrainedModel:
    """The model directory at `path` as a scalar-head network in `dtype`: with its own head
    when it has one (a scalar-head reward model), else its backbone under a new head drawn
    from the global generator (the caller seeds it). role names the model in the error for a
    path that is not a model directory (e.g. "critic backbone"). attn_implementation: the
    policy's (policy.attn_implementation), for a critic built from it."""
    if not (path / "config.json").is_file():
        raise MissingPathError(f"{role} {path} is not a model directory (no config.json)")
    with reading_checkpoint(path):
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        keep_head = _has_scalar_head(config)
        if not keep_head:
            config = _scalar_head_config(config)
        # the head is new by design: transformers' "newly initialized" report is noise
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            net: PreTrainedModel = AutoModelForTokenClassification.from_pretrained(
                path,
                config=config,
                dtype=DTYPES[dtype],
                local_files_only=True,
                ignore_mismatched_sizes=not keep_head,
                **attention_kwargs(attn_implementation),
            )
        finally:
            hf_logging.set_verbosity(verbosity)
    return net


def scalar_head_on_model(model: PreTrainedModel, dtype: str) -> PreTrainedModel:
    """`model`'s backbone (its weights copied) under a new head drawn from the global generator
    (the caller seeds it), in `dtype` on `model`'s device."""
    net = AutoModelForTokenClassification.from_config(_scalar_head_config(model.config))
    net.base_model.load_state_dict(model.base_model.state_dict())
    net.to(model.device, DTYPES[dtype])
    return net
