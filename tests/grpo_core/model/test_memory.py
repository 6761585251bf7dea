"""Memory at real sizes: log-probs through the output layer in token chunks equal the whole
logits' (values, entropies and gradients, fp32 within 1e-5) on the padded and the
shared-prompt paths, without ever holding more than a chunk of logits; gradient
checkpointing recomputes the decoder layers in backward and keeps the gradients."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import GPT2Config, GPT2LMHeadModel

from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.model.checkpointing import is_checkpointing, set_gradient_checkpointing
from grpo_core.model.chunked_head import decoder_and_head
from grpo_core.model.forward import sequence_logprobs, sequence_logprobs_and_entropy
from tests.models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 12
ATOL = 1e-5


def grouped_rows(seed: int, groups: int, longest: int, share: bool) -> PolicyBatch:
    """`groups` x 3 rows of completions up to `longest` tokens; with `share`, each group's
    rows share their prompt (the KV-cache path), otherwise every prompt differs."""
    gen = torch.Generator().manual_seed(seed)
    prompts, completions = [], []
    for g in range(groups * 3):
        prompt_of = g // 3 if share else g
        prompt_gen = torch.Generator().manual_seed(seed * 100 + prompt_of)
        prompts.append(torch.randint(1, VOCAB, (1 + prompt_of % 4,), generator=prompt_gen).tolist())
        length = int(torch.randint(0, longest + 1, (1,), generator=gen))
        completions.append(torch.randint(0, VOCAB, (length,), generator=gen).tolist())
    return build_policy_batch(prompts, completions, pad_id=0, padding_side="left")


def outputs(
    model: torch.nn.Module, batch: PolicyBatch, chunk: int | None
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """Log-probs, entropies and the gradient of a weighted sum of the log-probs."""
    model.zero_grad()
    logp, entropy = sequence_logprobs_and_entropy(model, batch, 0.7, logits_chunk_tokens=chunk)
    weights = torch.linspace(-1.0, 2.0, logp.numel()).reshape(logp.shape)
    (logp * weights).sum().backward()
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return logp.detach(), entropy, grads


def assert_same(a: tuple, b: tuple) -> None:  # type: ignore[type-arg]
    assert torch.allclose(a[0], b[0], atol=ATOL)
    assert torch.allclose(a[1], b[1], atol=ATOL)
    assert len(a[2]) == len(b[2]) > 0
    for x, y in zip(a[2], b[2], strict=True):
        assert torch.allclose(x, y, atol=ATOL)


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 1000),
    chunk=st.integers(1, 40),
    longest=st.integers(1, 12),
    share=st.booleans(),
    tied=st.booleans(),
)
def test_chunked_head_equals_the_whole_logits(
    seed: int, chunk: int, longest: int, share: bool, tied: bool
) -> None:
    model = tiny_llama(vocab=VOCAB, layers=2, tied=tied, positions=64)
    batch = grouped_rows(seed, 2, longest, share)
    assert_same(outputs(model, batch, chunk), outputs(model, batch, None))


@pytest.mark.parametrize("share", [False, True])
def test_no_pass_through_the_head_holds_more_than_a_chunk(share: bool) -> None:
    model = tiny_llama(vocab=VOCAB, layers=1)
    rows_seen: list[int] = []
    model.lm_head.register_forward_hook(
        lambda _module, inputs, _out: rows_seen.append(inputs[0].shape[:-1].numel())
    )
    batch = grouped_rows(3, 2, 10, share)
    outputs(model, batch, 4)
    assert rows_seen and max(rows_seen) <= 4
    rows_seen.clear()
    outputs(model, batch, None)
    assert max(rows_seen) > 4  # the whole path runs every position through at once


def test_heads_that_cannot_be_reproduced_take_the_whole_logits() -> None:
    torch.manual_seed(0)
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=VOCAB,
            n_positions=64,
            n_embd=16,
            n_layer=1,
            n_head=2,
            bos_token_id=1,
            eos_token_id=1,
        )
    ).eval()
    assert decoder_and_head(gpt2) is None
    assert decoder_and_head(torch.nn.Sequential(tiny_llama())) is None  # a wrapper's forward
    assert decoder_and_head(tiny_llama()) is not None
    batch = grouped_rows(1, 2, 6, share=False)
    with torch.no_grad():
        chunked = sequence_logprobs(gpt2, batch, logits_chunk_tokens=3)
        whole = sequence_logprobs(gpt2, batch)
    assert torch.equal(chunked, whole)


def count_layer_forwards(model: torch.nn.Module) -> list[int]:
    calls = [0]  # counted in each layer's MLP: the layer's own hooks stay outside the recompute
    for layer in model.model.layers:
        layer.mlp.register_forward_pre_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize("share", [False, True])
def test_gradient_checkpointing_recomputes_layers_and_keeps_the_gradients(share: bool) -> None:
    batch = grouped_rows(5, 2, 8, share)
    plain = tiny_llama(vocab=VOCAB, layers=2).train()
    checkpointed = tiny_llama(vocab=VOCAB, layers=2).train()
    set_gradient_checkpointing(checkpointed, True)
    assert is_checkpointing(checkpointed) and not is_checkpointing(plain)
    calls = count_layer_forwards(checkpointed)
    got = outputs(checkpointed, batch, None)
    # the shared-prompt path falls back to one padded pass: 2 layers, run again in backward
    assert calls[0] == 4
    assert_same(got, outputs(plain, batch, None))
    set_gradient_checkpointing(checkpointed, False)
    assert not is_checkpointing(checkpointed)


def test_gradient_checkpointing_needs_a_transformers_model() -> None:
    with pytest.raises(ValueError, match="needs a transformers model"):
        set_gradient_checkpointing(torch.nn.Linear(2, 2), True)
    set_gradient_checkpointing(torch.nn.Linear(2, 2), False)  # nothing to switch off
