"""The tests' one tiny-model builder: a seeded Llama small enough for unit tests on a CPU.
(Tests of the product's own builder use grpo_core.model.policy.create_tiny_policy.)"""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def tiny_llama(
    *,
    seed: int = 0,
    vocab: int = 12,
    hidden: int = 16,
    intermediate: int = 32,
    layers: int = 1,
    heads: int = 2,
    kv_heads: int = 2,
    positions: int = 64,
    tied: bool = False,
    pad_token_id: int | None = None,
    attn: str | None = None,
) -> LlamaForCausalLM:
    """A Llama with weights drawn after torch.manual_seed(seed): the same arguments give the
    same weights. attn: the attention implementation ('sdpa', 'eager'), else the default."""
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=positions,
        tie_word_embeddings=tied,
        pad_token_id=pad_token_id,
    )
    model = LlamaForCausalLM(cfg)
    if attn is not None:
        model.set_attn_implementation(attn)
    return model
