"""Next-token log-probs and entropies of a causal LM: through the whole (B, T, V) logits, or
the decoder's hidden states through the output layer in token chunks, each chunk's logits
recomputed in backward, so at most one chunk of logits is alive at a time."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint
from transformers import PreTrainedModel

from grpo_core.model.logits import entropy_from_logits, token_logprobs

# Architectures whose causal-LM logits are exactly lm_head(decoder(...).last_hidden_state):
# no final softcapping or logit scale (Gemma 2, Cohere and Granite have one; they take the
# full path).
PLAIN_HEAD_TYPES = frozenset({"llama", "qwen2", "qwen3", "mistral"})


def decoder_and_head(model: nn.Module) -> tuple[nn.Module, nn.Module] | None:
    """The decoder body and the output layer whose composition is `model`'s logits, or None
    when they cannot be reproduced exactly (another architecture, or a wrapper such as DDP
    or DeepSpeed whose own forward must run)."""
    if not isinstance(model, PreTrainedModel):
        return None
    if getattr(model.config, "model_type", None) not in PLAIN_HEAD_TYPES:
        return None
    head = model.get_output_embeddings()
    if type(head) is not nn.Linear:
        return None
    return model.get_decoder(), head


def _chunk_outputs(
    hidden: Tensor, labels: Tensor, head: nn.Module, temperature: float, with_entropy: bool
) -> tuple[Tensor, Tensor]:
    logits = head(hidden)
    logp = token_logprobs(logits, labels, temperature)
    if not with_entropy:
        return logp, logp.new_zeros(0)
    return logp, entropy_from_logits(logits.detach(), temperature)


def chunked_head_outputs(
    hidden: Tensor,
    head: nn.Module,
    labels: Tensor,
    temperature: float,
    chunk_tokens: int,
    with_entropy: bool,
) -> tuple[Tensor, Tensor | None]:
    """token_logprobs (and entropies) of head(hidden) at `labels`, chunk_tokens positions at
    a time; (B, T, H) hidden, (B, T) labels -> (B, T) float32 each."""
    flat = hidden.reshape(-1, hidden.shape[-1])
    flat_labels = labels.reshape(-1)
    recompute = torch.is_grad_enabled()
    logps: list[Tensor] = []
    entropies: list[Tensor] = []
    for start in range(0, flat.shape[0], chunk_tokens):
        args = (flat[start : start + chunk_tokens], flat_labels[start : start + chunk_tokens])
        out: Any = (
            checkpoint(_chunk_outputs, *args, head, temperature, with_entropy, use_reentrant=False)
            if recompute
            else _chunk_outputs(*args, head, temperature, with_entropy)
        )
        logps.append(out[0])
        entropies.append(out[1])
    logp = torch.cat(logps).reshape(labels.shape)
    if not with_entropy:
        return logp, None
    return logp, torch.cat(entropies).reshape(labels.shape)


def next_token_outputs(
    model: nn.Module,
    inputs: dict[str, Any],
    labels: Tensor,
    temperature: float,
    with_entropy: bool,
    chunk_tokens: int | None = None,
) -> tuple[Tensor, Tensor | None]:
    """log p(labels[:, j] | inputs up to position j) for j < T - 1, (B, T - 1) float32, and
    the entropies there if asked: from model(**inputs).logits, or with chunk_tokens set (and
    a head decoder_and_head can reproduce) in chunks of that many positions."""
    parts = None if chunk_tokens is None else decoder_and_head(model)
    if parts is None or chunk_tokens is None:
        logits = model(**inputs).logits[:, :-1]
        logp = token_logprobs(logits, labels, temperature)
        return logp, (entropy_from_logits(logits, temperature) if with_entropy else None)
    decoder, head = parts
    hidden = decoder(**inputs).last_hidden_state[:, :-1]
    return chunked_head_outputs(hidden, head, labels, temperature, chunk_tokens, with_entropy)
