"""Packed rows (grpo_core/model/packing.py): a batch's attended tokens as one row whose
position ids restart per row give the log-probs, entropies and critic values of the padded
batch (fp32, within 1e-5) under sdpa and eager attention, left or right padding, for any row
lengths, in every architecture that packs; a model that cannot pack is named with the
reason, once in the log, as is the cost of sdpa's dense attention over the packed row."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import AutoConfig, AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel

from grpo_core.algo.micro_batches import planned_logprobs
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.model import packing
from grpo_core.model.critic import ValueModel
from grpo_core.model.forward import sequence_logprobs, sequence_logprobs_and_entropy
from grpo_core.model.packing import PACKED_MODEL_TYPES, pack_rows, packing_refusal, packs
from tests.models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def ragged(lengths: list[tuple[int, int]], side: str = "right", seed: int = 0) -> PolicyBatch:
    """Rows of (prompt, completion) token counts, random ids."""
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(1, 12, (p,), generator=gen).tolist() for p, _ in lengths]
    completions = [torch.randint(0, 12, (c,), generator=gen).tolist() for _, c in lengths]
    return build_policy_batch(prompts, completions, pad_id=0, padding_side=side)  # type: ignore[arg-type]


ROWS = [(3, 5), (1, 0), (2, 9), (1, 1), (4, 2)]


def test_pack_rows_restarts_positions_and_places_values_back() -> None:
    batch = ragged(ROWS, side="left")
    rows = pack_rows(batch)
    assert rows.input_ids.shape == (1, sum(p + c for p, c in ROWS))
    starts = [0, 8, 9, 20, 22]  # each row's first packed token
    assert (rows.position_ids[0] == 0).nonzero().flatten().tolist() == starts
    assert torch.equal(rows.unpack(rows.input_ids[0]), batch.input_ids * batch.attention_mask)
    # a reading for the next token never crosses into the next row
    shifted = rows.shift_unpack(torch.ones(len(rows) - 1))
    assert torch.equal(shifted, ((batch.position_ids > 0) & (batch.attention_mask > 0)).float())


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("side", ["left", "right"])
def test_packed_rows_give_the_padded_logprobs_and_entropies(attn: str, side: str) -> None:
    model = tiny_llama(layers=2, attn=attn)
    batch = ragged(ROWS, side=side)
    logp, entropy = sequence_logprobs_and_entropy(model, batch)
    packed_logp, packed_entropy = sequence_logprobs_and_entropy(model, batch, packed=True)
    assert torch.allclose(packed_logp, logp, atol=1e-5)
    assert torch.allclose(packed_entropy, entropy, atol=1e-5)
    assert float(logp.detach().abs().sum()) > 1.0


def tiny_of_type(model_type: str) -> torch.nn.Module:
    """A 2-layer model of each architecture packing_refusal lets pack, seeded."""
    torch.manual_seed(0)
    sizes = {
        "vocab_size": 12,
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "max_position_embeddings": 64,
    }
    if model_type == "qwen3":
        sizes["head_dim"] = 8
    config = AutoConfig.for_model(model_type, **sizes)
    return AutoModelForCausalLM.from_config(config)


@pytest.mark.parametrize("model_type", sorted(PACKED_MODEL_TYPES))
def test_every_packing_architecture_gives_the_padded_logprobs(model_type: str) -> None:
    model = tiny_of_type(model_type)
    assert packing_refusal(model) is None
    batch = ragged(ROWS, side="left")
    with torch.no_grad():
        padded = sequence_logprobs(model, batch)
        packed = sequence_logprobs(model, batch, packed=True)
    assert torch.allclose(packed, padded, atol=1e-5)
    assert float(padded.abs().sum()) > 1.0


def test_the_packed_row_goes_to_the_model_without_an_attention_mask() -> None:
    """With a mask of ones, transformers reads one sequence and the rows attend to each other:
    the position ids separate them only when no mask is given."""
    model = tiny_llama(layers=2)
    batch = ragged(ROWS)
    calls: list[dict[str, Any]] = []
    model.register_forward_pre_hook(lambda _m, _a, kw: calls.append(kw), with_kwargs=True)
    logp = sequence_logprobs(model, batch, packed=True)
    assert len(calls) == 1 and calls[0]["input_ids"].shape[0] == 1
    assert "attention_mask" not in calls[0]
    rows = pack_rows(batch)
    with torch.no_grad():
        masked = model(**rows.model_inputs(), attention_mask=torch.ones_like(rows.input_ids))
    crossed = torch.log_softmax(masked.logits[0, :-1], -1).gather(-1, rows.input_ids[0, 1:, None])[
        :, 0
    ]
    wrong = torch.where(batch.response_mask > 0, rows.shift_unpack(crossed), 0.0)
    assert not torch.allclose(wrong, logp, atol=1e-3)


@given(
    rows=st.lists(st.tuples(st.integers(1, 4), st.integers(0, 20)), min_size=1, max_size=9),
    budget=st.integers(1, 60),
    side=st.sampled_from(["left", "right"]),
)
def test_packed_token_budget_passes_give_the_padded_logprobs(
    rows: list[tuple[int, int]], budget: int, side: str
) -> None:
    """Any row lengths and budget: every row in exactly one pass, each pass within the budget
    (or one row alone), and the log-probs of one padded pass; one packed pass of every row
    gives its gradient too."""
    model = tiny_llama(layers=2)
    batch = ragged(rows, side=side)
    passes: list[int] = []
    model.register_forward_pre_hook(
        lambda _m, _a, kw: passes.append(int(kw["input_ids"].shape[1])), with_kwargs=True
    )
    with torch.no_grad():
        packed = planned_logprobs(model, batch, 1.0, budget, packed=True)
        lengths = sorted((p + c for p, c in rows), reverse=True)
        assert sum(passes) == sum(lengths)
        assert all(n <= budget or n in lengths for n in passes)
        passes.clear()
        padded = sequence_logprobs(model, batch)
    assert torch.allclose(packed, padded, atol=1e-5)
    weights = torch.randn(padded.shape, generator=torch.Generator().manual_seed(len(rows)))
    grads = []
    for pack in (False, True):
        model.zero_grad()
        (sequence_logprobs(model, batch, packed=pack) * weights).sum().backward()
        grads.append([p.grad.clone() for p in model.parameters() if p.grad is not None])
    for padded_grad, packed_grad in zip(*grads, strict=True):
        assert torch.allclose(packed_grad, padded_grad, atol=1e-5, rtol=1e-4)


def test_packed_critic_values_and_gradients_equal_the_padded_ones(tmp_path: Path) -> None:
    tiny_llama(layers=2).save_pretrained(tmp_path)
    batch = ragged(ROWS, side="left")
    grads, values = [], []
    for packed in (False, True):
        critic = ValueModel.from_backbone(tmp_path)
        out = critic(batch, packed=packed)
        (out * torch.arange(out.numel()).reshape(out.shape)).sum().backward()
        values.append(out.detach())
        grads.append([p.grad for p in critic.parameters() if p.grad is not None])
    assert torch.allclose(values[1], values[0], atol=1e-5)
    assert float(values[0].abs().sum()) > 0
    for padded, packed_grad in zip(*grads, strict=True):
        assert torch.allclose(packed_grad, padded, atol=1e-5, rtol=1e-5)


def test_a_model_that_cannot_pack_is_named_once_in_the_log(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packing, "_NOTED", set())
    gpt2 = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=12,
            n_positions=32,
            n_embd=16,
            n_layer=1,
            n_head=2,
            bos_token_id=None,
            eos_token_id=None,
        )
    )
    assert "model type 'gpt2'" in str(packing_refusal(gpt2))
    assert packing_refusal(tiny_llama()) is None
    flex = tiny_llama()
    flex.config._attn_implementation = "flex_attention"
    assert "attention 'flex_attention'" in str(packing_refusal(flex))
    with caplog.at_level(logging.INFO, logger=packing.__name__):
        assert not packs(gpt2, True, "policy")
        assert not packs(gpt2, True, "policy")
        assert not packs(gpt2, False, "critic")
        assert packs(tiny_llama(), True, "policy")
    ours = [r for r in caplog.records if r.name == packing.__name__]
    warnings = [r for r in ours if r.levelno == logging.WARNING]
    assert len(warnings) == 2  # gpt2 once, not again; sdpa's cost once
    assert "the policy runs padded micro-batches" in warnings[0].getMessage()
    assert "sdpa attention masks the packed row" in warnings[1].getMessage()
