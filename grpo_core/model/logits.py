"""Per-token log-probs and entropies from a model's logits, in float32 without holding a
float32 copy of the whole (B, T, V) logits. Shapes: B sequences, T positions, V vocabulary."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

# Rows of logits turned into float32 at once; bounds the temporary float32 copy of logits.
LOGPROB_CHUNK_ROWS = 1024


class _TokenLogProb(torch.autograd.Function):
    """log softmax(logits / temperature)[label] in float32, saving only the input logits.

    Forward and backward walk over row chunks, so the float32 softmax of the full (B*T, V)
    logits is never held: autograd keeps the logits (which the model output holds anyway)
    and the (B*T,) log-normalisers.
    """

    @staticmethod
    def forward(ctx: Any, logits: Tensor, labels: Tensor, temperature: float) -> Tensor:
        flat = logits.reshape(-1, logits.shape[-1])
        flat_labels = labels.reshape(-1, 1)
        out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(out)
        for start in range(0, flat.shape[0], LOGPROB_CHUNK_ROWS):
            rows = slice(start, start + LOGPROB_CHUNK_ROWS)
            chunk = flat[rows].float() / temperature
            lse[rows] = torch.logsumexp(chunk, dim=-1)
            out[rows] = chunk.gather(-1, flat_labels[rows]).squeeze(-1) - lse[rows]
        ctx.save_for_backward(logits, labels, lse)
        ctx.temperature = temperature
        return out.reshape(labels.shape)

    @staticmethod
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor, None, None]:
        logits, labels, lse = ctx.saved_tensors
        temperature: float = ctx.temperature
        flat = logits.reshape(-1, logits.shape[-1])
        flat_labels = labels.reshape(-1, 1)
        flat_grad = grad_out.reshape(-1, 1).float() / temperature
        grad = torch.empty_like(flat)
        for start in range(0, flat.shape[0], LOGPROB_CHUNK_ROWS):
            rows = slice(start, start + LOGPROB_CHUNK_ROWS)
            probs = torch.exp(flat[rows].float() / temperature - lse[rows, None])
            chunk_grad = -probs * flat_grad[rows]
            chunk_grad.scatter_add_(-1, flat_labels[rows], flat_grad[rows])
            grad[rows] = chunk_grad.to(flat.dtype)
        return grad.reshape(logits.shape), None, None


def token_logprobs(logits: Tensor, labels: Tensor, temperature: float = 1.0) -> Tensor:
    """log pi(o_t | q, o_<t) at `temperature`, float32; (B, T, V) logits, (B, T) labels."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 (got {temperature}); greedy has no log-probs")
    result = _TokenLogProb.apply(logits, labels.long(), float(temperature))
    assert isinstance(result, Tensor)
    return result


@torch.no_grad()
def entropy_from_logits(logits: Tensor, temperature: float = 1.0) -> Tensor:
    """Entropy of softmax(logits / temperature) per position, float32, no grad; (B, T)."""
    flat = logits.reshape(-1, logits.shape[-1])
    out = torch.empty(flat.shape[0], dtype=torch.float32, device=logits.device)
    for start in range(0, flat.shape[0], LOGPROB_CHUNK_ROWS):
        chunk = flat[start : start + LOGPROB_CHUNK_ROWS].float() / temperature
        logp = torch.log_softmax(chunk, dim=-1)
        out[start : start + LOGPROB_CHUNK_ROWS] = -(logp.exp() * logp).sum(-1)
    return out.reshape(logits.shape[:-1])
