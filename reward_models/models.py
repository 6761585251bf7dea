"""Reward models (ORM and PRM): a transformers network in one of the registered formats
(reward_models/formats.py), its own tokenizer, and one binary logit per token.

The built-in format (scalar_head) is the scalar-head network of grpo_core/model/scalar_head.py
(as PPO's critic): a backbone (the policy's) plus a new `Linear(hidden, 1)` token head.
Pretrained checkpoints keep their own class and head. Saved and loaded in HF format, with the
kind, format and tokens in `reward_model.json`. Which tokens are read: reward_models/views.py.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn
from transformers import AutoConfig, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.errors import MissingPathError
from grpo_core.model.policy import DTYPES, ensure_pad_token, reading_checkpoint
from grpo_core.model.scalar_head import scalar_head_from_directory, scalar_head_on_model
from reward_models.config import ORM_SOURCE, RewardModelSettings, RMKind
from reward_models.formats import RM_FORMATS, SCALAR_HEAD
from reward_models.sources import (
    auto_class,
    check_network,
    load_network,
    load_tokenizer,
    marker_encoder,
    read_token_ids,
)
from reward_models.views import RMEncoder

META_FILE = "reward_model.json"


class RewardModel(nn.Module):
    """A network and its own tokenizer in format `format` (with its token strings `tokens`,
    unset ones at the format's defaults); `forward` gives one binary logit per token, (B, L),
    the score of a position being its sigmoid."""

    def __init__(
        self,
        net: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        kind: RMKind,
        format: str = SCALAR_HEAD.name,
        tokens: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__()
        if kind not in ("orm", "prm"):
            raise ValueError(f"reward model kind must be 'orm' or 'prm' (got {kind!r})")
        spec = RM_FORMATS[format]
        where = f"reward_models.{kind}"
        self.tokens = spec.resolved_tokens(tokens or {})
        check_network(net, spec, where)
        ensure_pad_token(tokenizer)
        net.config.pad_token_id = tokenizer.pad_token_id
        self.net = net
        self.tokenizer = tokenizer
        self.kind: RMKind = kind
        self.format = format
        self.read_ids = read_token_ids(tokenizer, spec, self.tokens, where)
        self._logits = spec.logits_function()

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def encoder(self) -> RMEncoder:
        """How this model reads an output: its tokenizer, and its marker after each step."""
        return marker_encoder(self.tokenizer, RM_FORMATS[self.format], self.tokens, self.kind)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Per-token binary logits (B, L); apply a sigmoid for probabilities."""
        logits: torch.Tensor = self._logits(
            self.net, input_ids, attention_mask, position_ids, self.read_ids
        )
        return logits

    def as_kind(self, kind: RMKind) -> RewardModel:
        """The same network and tokenizer as a reward model of `kind` (a PRM from an ORM)."""
        return RewardModel(self.net, self.tokenizer, kind, self.format, self.tokens)

    @classmethod
    def from_policy(
        cls,
        policy: str | Path | PreTrainedModel,
        kind: RMKind,
        tokenizer: PreTrainedTokenizerBase | None = None,
        seed: int = 0,
        dtype: str = "float32",
    ) -> RewardModel:
        """A scalar_head RM in `dtype`: the backbone of a policy (model or local dir) under a
        new head drawn from `seed`, with the policy's tokenizer (a directory's own by default).
        A directory holding a scalar_head RM (the ORM a PRM starts from) keeps its head."""
        torch.manual_seed(seed)
        if isinstance(policy, PreTrainedModel):
            if tokenizer is None:
                raise ValueError("from_policy(model) needs the policy's tokenizer")
            return cls(scalar_head_on_model(policy, dtype), tokenizer, kind)
        path = Path(policy)
        net = scalar_head_from_directory(path, dtype, "reward-model backbone")
        return cls(net, tokenizer or load_tokenizer(path, f"reward_models.{kind}"), kind)

    @classmethod
    def from_checkpoint(
        cls,
        path: str | Path,
        kind: RMKind,
        format: str,
        tokens: Mapping[str, str] | None = None,
        dtype: str = "float32",
    ) -> RewardModel:
        """A pretrained reward model as its format reads it: its own class, head and tokenizer,
        its parameters in `dtype`."""
        where = f"reward_models.{kind}"
        net = load_network(Path(path), RM_FORMATS[format], where, dtype)
        return cls(net, load_tokenizer(Path(path), where), kind, format, tokens)

    def save(
        self, directory: str | Path, state_dict: dict[str, torch.Tensor] | None = None
    ) -> Path:
        """Write weights (safetensors), config, tokenizer and the RM's kind, format and tokens
        to `directory`.

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
        meta = {"kind": self.kind, "format": self.format, "tokens": self.tokens}
        (path / META_FILE).write_text(json.dumps(meta) + "\n")
        return path

    @classmethod
    def load(
        cls, directory: str | Path, device: str | torch.device = "cpu", dtype: str = "float32"
    ) -> RewardModel:
        """A reward model saved by `save`, its parameters in `dtype`; clear error naming the
        path when it is missing. (Checkpoints saved before formats existed are scalar_head.)"""
        path = Path(directory)
        meta_file = path / META_FILE
        if not meta_file.is_file():
            raise MissingPathError(
                f"no reward-model checkpoint at {path} ({META_FILE} missing): "
                "was the RM of that iteration saved?"
            )
        with reading_checkpoint(path):
            meta = json.loads(meta_file.read_text())
            config = AutoConfig.from_pretrained(path)
            net = auto_class(config).from_pretrained(path, dtype=DTYPES[dtype])
            tokenizer = AutoTokenizer.from_pretrained(path)
        model = cls(
            net, tokenizer, meta["kind"], meta.get("format", SCALAR_HEAD.name), meta.get("tokens")
        )
        return model.to(device)


def load_or_init_reward_model(
    prev_dir: str | Path | None,
    init_source: str | Path | PreTrainedModel | None,
    kind: RMKind,
    settings: RewardModelSettings | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    seed: int = 0,
    dtype: str = "float32",
) -> RewardModel:
    """The k-1 reward model from prev_dir (continual training), or, when None, the iteration-0
    model of `settings` (default: scalar_head from the policy) from `init_source`: the policy
    (a model or its directory), the ORM's checkpoint (settings.source 'orm') or a directory.

    A prev_dir that holds no checkpoint is an error naming the path, never a silent restart.
    """
    settings = settings or RewardModelSettings()
    if prev_dir is not None:
        model = RewardModel.load(prev_dir, dtype=dtype)
        if model.kind != kind:
            raise ValueError(f"reward model at {prev_dir} is a {model.kind}, expected a {kind}")
        if model.format != settings.format:
            raise ValueError(
                f"reward model at {prev_dir} is a {model.format}, expected a {settings.format}"
            )
        return model
    if init_source is None:
        raise ValueError(f"a new {kind} (no previous checkpoint) needs its source")
    if settings.spec.new_head:
        return RewardModel.from_policy(init_source, kind, tokenizer, seed, dtype)
    if isinstance(init_source, PreTrainedModel):
        raise ValueError(f"format {settings.format} starts from a checkpoint directory")
    # Seeded like a new head: the global generator leaves the stage in the same state.
    torch.manual_seed(seed)
    if settings.source == ORM_SOURCE:
        return RewardModel.load(init_source, dtype=dtype).as_kind(kind)
    tokens = settings.tokens
    return RewardModel.from_checkpoint(init_source, kind, settings.format, tokens, dtype)
