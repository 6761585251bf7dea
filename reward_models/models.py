"""Reward models: a causal-LM backbone with a scalar head per token (ORM and PRM).

The network is transformers' `AutoModelForTokenClassification` with `num_labels=1`: the
backbone of the policy plus a `Linear(hidden, 1)` head, saved and loaded in HF format. An
ORM reads the score at the last response token, a PRM at each step-end token.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)
from transformers.utils import logging as hf_logging

from grpo_core.contracts.errors import MissingPathError
from grpo_core.model.policy import ensure_pad_token, reading_checkpoint
from reward_models.config import RMKind

META_FILE = "reward_model.json"


def _head_config(config: PretrainedConfig) -> PretrainedConfig:
    """Copy of a backbone config for a one-scalar token head without dropout."""
    out = config.__class__.from_dict(config.to_dict())
    out.num_labels = 1
    out.classifier_dropout = 0.0
    out.architectures = None
    return out


class RewardModel(nn.Module):
    """Backbone + scalar head; `forward` gives one logit per token, shape (B, L)."""

    def __init__(
        self, net: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, kind: RMKind
    ) -> None:
        super().__init__()
        if kind not in ("orm", "prm"):
            raise ValueError(f"reward model kind must be 'orm' or 'prm' (got {kind!r})")
        if net.config.num_labels != 1:
            raise ValueError(f"reward model needs num_labels=1 (got {net.config.num_labels})")
        ensure_pad_token(tokenizer)
        net.config.pad_token_id = tokenizer.pad_token_id
        self.net = net
        self.tokenizer = tokenizer
        self.kind: RMKind = kind

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token logits (B, L); apply a sigmoid for probabilities."""
        out = self.net(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        )
        logits: torch.Tensor = out.logits[..., 0]
        return logits

    @classmethod
    def from_policy(
        cls,
        policy: str | Path | PreTrainedModel,
        kind: RMKind,
        tokenizer: PreTrainedTokenizerBase | None = None,
        seed: int = 0,
    ) -> RewardModel:
        """A fresh RM whose backbone is copied from a policy (model or local dir); head seeded."""
        torch.manual_seed(seed)
        if isinstance(policy, PreTrainedModel):
            if tokenizer is None:
                raise ValueError("from_policy(model) needs the policy's tokenizer")
            net = AutoModelForTokenClassification.from_config(_head_config(policy.config))
            net.base_model.load_state_dict(policy.base_model.state_dict())
            net.to(policy.device)
            return cls(net, tokenizer, kind)
        path = Path(policy)
        if not (path / "config.json").is_file():
            raise MissingPathError(
                f"reward-model backbone {path} is not a model directory (no config.json)"
            )
        config = _head_config(AutoConfig.from_pretrained(path))
        # The head is new by design: transformers' load report ("score.weight MISSING") is
        # noise here, so its warnings are held back while the backbone loads.
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            net = AutoModelForTokenClassification.from_pretrained(path, config=config)
        finally:
            hf_logging.set_verbosity(verbosity)
        return cls(net, tokenizer or AutoTokenizer.from_pretrained(path), kind)

    def save(
        self, directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None
    ) -> Path:
        """Write weights (safetensors), config, tokenizer and the RM kind to `directory`.

        state_dict (keys of this module's state_dict) replaces the weights held here, e.g.
        whole weights gathered from a DeepSpeed engine.
        """
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        if state_dict is None:
            self.net.save_pretrained(path)
        else:
            net_weights = {k.removeprefix("net."): v for k, v in state_dict.items()}
            self.net.save_pretrained(path, state_dict=net_weights)
        self.tokenizer.save_pretrained(path)
        (path / META_FILE).write_text(json.dumps({"kind": self.kind}) + "\n")
        return path

    @classmethod
    def load(cls, directory: str | Path, device: str | torch.device = "cpu") -> RewardModel:
        """A reward model saved by `save`; clear error naming the path when it is missing."""
        path = Path(directory)
        meta = path / META_FILE
        if not meta.is_file():
            raise MissingPathError(
                f"no reward-model checkpoint at {path} ({META_FILE} missing): "
                "was the RM of that iteration saved?"
            )
        with reading_checkpoint(path):
            kind = json.loads(meta.read_text())["kind"]
            net = AutoModelForTokenClassification.from_pretrained(path)
            tokenizer = AutoTokenizer.from_pretrained(path)
        model = cls(net, tokenizer, kind)
        return model.to(device)
