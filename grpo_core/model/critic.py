"""PPO's value model (critic): a causal-LM backbone with one scalar head, read at every token.

The scalar-head network of grpo_core/model/scalar_head.py, as the scalar_head reward models
are, so a critic starts from the policy's backbone under a new head or from a scalar-head ORM
with its head. Saved in HF format (safetensors) with `critic.json` marking the directory as a
critic.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import cast

import torch
from torch import Tensor, nn
from transformers import AutoModelForTokenClassification, PreTrainedModel

from grpo_core.contracts.errors import MissingPathError
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.model.packing import pack_rows
from grpo_core.model.policy import DTYPES, attention_kwargs, reading_checkpoint
from grpo_core.model.scalar_head import scalar_head_from_directory

CRITIC_FILE = "critic.json"


class ValueModel(nn.Module):
    """V(s_t) of every prefix: `forward(batch)` is (B, L), column j holding the value of the
    prefix before token j (read at position j - 1, where the policy's log-prob of token j
    is read too), 0 outside the response."""

    def __init__(self, net: PreTrainedModel) -> None:
        super().__init__()
        self.net = net

    @property
    def device(self) -> torch.device:
        return next(self.parameters()).device

    @property
    def vocab_size(self) -> int:
        """The backbone's vocabulary (must be the policy's: the critic reads its token ids)."""
        return int(cast(PreTrainedModel, self.net).config.vocab_size)

    def forward(self, batch: PolicyBatch, packed: bool = False) -> Tensor:
        """Values (B, L) in float32, aligned with the policy's token log-probs; `packed`: the
        rows run as one row without padding (grpo_core/model/packing.py)."""
        if packed:
            rows = pack_rows(batch)
            packed_out = self.net(**rows.model_inputs()).logits[0, :-1, 0]
            return rows.shift_unpack(packed_out.float()) * batch.response_mask
        out = self.net(
            input_ids=batch.input_ids,
            attention_mask=batch.attention_mask,
            position_ids=batch.position_ids,
            use_cache=False,
        ).logits[..., 0]
        values = nn.functional.pad(out[:, :-1].float(), (1, 0))
        return values * batch.response_mask

    @classmethod
    def from_backbone(
        cls,
        path: str | Path,
        dtype: str = "float32",
        seed: int = 0,
        attn_implementation: str | None = None,
    ) -> ValueModel:
        """A critic from a model directory: a policy's backbone under a new scalar head drawn
        from `seed` (the global RNG untouched), or a scalar-head reward model with its head;
        attention as policy.attn_implementation asks."""
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = scalar_head_from_directory(
                Path(path), dtype, "critic backbone", attn_implementation
            )
            return cls(net)

    def save(self, directory: str | Path, state_dict: dict[str, Tensor] | None = None) -> Path:
        """Weights (safetensors) and config into `directory`, marked as a critic; state_dict
        (keys of this module's state_dict) replaces the weights held here, e.g. whole weights
        gathered from a DeepSpeed engine."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        weights = None
        if state_dict is not None:
            weights = {k.removeprefix("net."): v for k, v in state_dict.items()}
        net = cast(PreTrainedModel, self.net)
        net.save_pretrained(path, safe_serialization=True, state_dict=weights)
        (path / CRITIC_FILE).write_text(json.dumps({"head": "scalar"}) + "\n")
        return path

    @classmethod
    def load(
        cls, directory: str | Path, dtype: str = "float32", attn_implementation: str | None = None
    ) -> ValueModel:
        """A critic saved by `save`, its parameters in `dtype`, attention as
        policy.attn_implementation asks."""
        path = Path(directory)
        if not (path / CRITIC_FILE).is_file():
            raise MissingPathError(
                f"no critic checkpoint at {path} ({CRITIC_FILE} missing): was the PPO "
                "critic of that iteration saved?"
            )
        with reading_checkpoint(path):
            net = AutoModelForTokenClassification.from_pretrained(
                path,
                dtype=DTYPES[dtype],
                local_files_only=True,
                **attention_kwargs(attn_implementation),
            )
        return cls(net)
