"""One decode step of a Llama-architecture model without transformers' module stack.

At one new token per row, transformers' Llama forward spends most of a small model's decode
step outside its matmuls: building the 4D attention mask, the cache's bookkeeping, keyword
plumbing and output objects, three projections where one would do. On the 0.7M-parameter
demo policy at 256 rows this loop decoded in ~0.82 of HF's time (bench/README.md,
"sampler.py"), more at smaller batches. It reads the model's own parameters (so the trainer's
in-place updates reach it), calls its own RMSNorm, embedding, rotary and head modules, and
computes attention over the preallocated KV buffers of hf_rollout.py in plain matmuls; logits
equal HF's forward to float round-off (tests/grpo_core/model/test_llama_decode.py).

Only plain Llama models qualify (`llama_decoder` returns None otherwise, and the caller keeps
HF's forward): `LlamaForCausalLM` itself, no projection biases, SiLU, its parameters whole
(not partitioned by DeepSpeed ZeRO-3); any rotary variant, since the model's own rotary
module computes the angles.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch
from torch import nn
from transformers import LlamaForCausalLM
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb


class KVBuffer(Protocol):
    """A layer's KV cache that takes the new token's keys/values and returns all of them."""

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]: ...


class LlamaDecoder:
    """Decode steps of one Llama model with its weights as they are now: the fused query/key/
    value and gate/up matrices are copies, so build a new decoder after the weights change
    (hf_rollout.py builds one per chunk it decodes)."""

    def __init__(self, model: LlamaForCausalLM) -> None:
        config = model.config
        self.model = model
        self.heads = int(config.num_attention_heads)
        self.kv_heads = int(config.num_key_value_heads or self.heads)
        self.head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // self.heads)
        self.layers = list(model.model.layers)
        with torch.no_grad():
            self.qkv = [
                torch.cat([a.q_proj.weight, a.k_proj.weight, a.v_proj.weight])
                for a in (layer.self_attn for layer in self.layers)
            ]
            self.gate_up = [
                torch.cat([layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight])
                for layer in self.layers
            ]

    @torch.inference_mode()
    def step(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        caches: Sequence[KVBuffer],
        attention_mask: torch.Tensor,
    ) -> torch.Tensor:
        """Logits (B, V) of the next token after `tokens` (B,) at `positions` (B,), each
        layer's keys/values appended to `caches`; attention_mask (B, L) is 1 where a cached
        position (this token's included) may be attended."""
        rows, group = len(tokens), self.heads // self.kv_heads
        q_width, kv_width = self.heads * self.head_dim, self.kv_heads * self.head_dim
        inner = self.model.model
        hidden = inner.embed_tokens(tokens)
        cos, sin = inner.rotary_emb(hidden, positions[:, None])  # (B, 1, D): per row
        blocked = ~attention_mask.bool()[:, None, None, :]  # (B, 1, 1, L)
        for layer, qkv_weight, gate_up_weight, cache in zip(
            self.layers, self.qkv, self.gate_up, caches, strict=True
        ):
            attention = layer.self_attn
            qkv = nn.functional.linear(layer.input_layernorm(hidden), qkv_weight)
            q = qkv[:, :q_width].view(rows, 1, self.heads, self.head_dim)
            k = qkv[:, q_width : q_width + kv_width].view(rows, 1, self.kv_heads, self.head_dim)
            v = qkv[:, q_width + kv_width :].view(rows, self.kv_heads, 1, self.head_dim)
            q, k = apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=2)  # over the heads
            keys, values = cache.update(k.transpose(1, 2), v)  # (B, KV, L, D)
            # query heads of one KV head side by side: (B, KV, group, D) against (B, KV, L, D)
            queries = q.view(rows, self.kv_heads, group, self.head_dim)
            scores = (queries @ keys.transpose(-1, -2)) * attention.scaling
            weights = scores.masked_fill(blocked, float("-inf")).softmax(-1, dtype=torch.float32)
            mixed = (weights.to(values.dtype) @ values).reshape(rows, q_width)
            hidden = hidden + attention.o_proj(mixed)
            gate, up = nn.functional.linear(
                layer.post_attention_layernorm(hidden), gate_up_weight
            ).chunk(2, dim=-1)
            hidden = hidden + layer.mlp.down_proj(layer.mlp.act_fn(gate) * up)
        out: torch.Tensor = self.model.lm_head(inner.norm(hidden))
        return out


def is_plain_llama(model: nn.Module) -> bool:
    """Whether `model` is a Llama whose forward a LlamaDecoder step reproduces."""
    if type(model) is not LlamaForCausalLM:  # a subclass, a PEFT or DeepSpeed wrapper
        return False
    config = model.config
    if config.attention_bias or config.mlp_bias or config.hidden_act != "silu":
        return False
    # DeepSpeed ZeRO-3 partitions parameters (`ds_id`), gathering them only inside the
    # module hooks of its forward, which this step does not run for the projections.
    return not any(hasattr(param, "ds_id") or not param.numel() for param in model.parameters())


def llama_decoder(model: nn.Module, caches: Sequence[Any]) -> LlamaDecoder | None:
    """A LlamaDecoder for `model` decoding into `caches` (one buffer per layer), or None where
    this step would not compute what the model's own forward does (module docstring)."""
    if not is_plain_llama(model):
        return None
    assert isinstance(model, LlamaForCausalLM)
    if len(caches) != model.config.num_hidden_layers:
        return None
    if not all(hasattr(cache, "update") for cache in caches):
        return None
    return LlamaDecoder(model)
