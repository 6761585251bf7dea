from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines import hf_rollout as rollout
from grpo_core.engines import live_kv_cache
from grpo_core.engines.hf_rollout import HFRolloutEngine, sample_tokens
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from grpo_core.model.prompts import Prompter

QUESTIONS = ["3", "3+4-2", "1+2-3+4-5+6-7+8-9+1-2+3-4+5-6"]  # very different prompt lengths


@pytest.fixture(scope="module")
def policy() -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    tok = build_char_tokenizer()
    model = create_tiny_policy(PolicyConfig(seed=1), tok)
    with torch.no_grad():  # make EOS likely so some rows stop early
        model.lm_head.weight[tok.eos_token_id] *= 0  # tied: also zeroes the EOS embedding
        model.model.norm.weight.mul_(3)
    return model, tok


def prompts(tok: PreTrainedTokenizerBase) -> list[str]:
    return [Prompter(tok)(q) for q in QUESTIONS]


def recomputed_logprobs(
    model: PreTrainedModel, prompt: list[int], completion: list[int], temperature: float
) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + completion])).logits[0].float()
    logp = torch.log_softmax(logits / temperature, -1)[len(prompt) - 1 : -1]
    return logp.gather(1, torch.tensor(completion)[:, None])[:, 0]


def test_same_seed_same_batch_and_batch_size_does_not_matter(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    model, tok = policy
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    a = HFRolloutEngine(model, tok, batch_size=4, show_progress=False).generate(
        prompts(tok), 3, params, seed=5
    )
    b = HFRolloutEngine(model, tok, batch_size=4, show_progress=False).generate(
        prompts(tok), 3, params, seed=5
    )
    c = HFRolloutEngine(model, tok, batch_size=9, show_progress=False).generate(
        prompts(tok), 3, params, seed=5
    )
    d = HFRolloutEngine(model, tok, batch_size=4, show_progress=False).generate(
        prompts(tok), 3, params, seed=6
    )
    assert a.completion_ids == b.completion_ids and a.logprobs == b.logprobs
    assert a.completion_ids == c.completion_ids
    assert a.completion_ids != d.completion_ids
    assert a.prompt_index == [0, 0, 0, 1, 1, 1, 2, 2, 2]


@pytest.mark.parametrize(("temperature", "top_p"), [(1.0, 1.0), (0.7, 0.9)])
def test_sampling_logprobs_match_full_forward_in_padded_batch(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], temperature: float, top_p: float
) -> None:
    model, tok = policy
    params = SamplingParams(max_new_tokens=24, temperature=temperature, top_p=top_p)
    batch = HFRolloutEngine(model, tok, batch_size=64, show_progress=False).generate(
        prompts(tok), 4, params, seed=0
    )
    for r in range(len(batch)):
        expected = recomputed_logprobs(
            model, batch.prompt_ids[r], batch.completion_ids[r], temperature
        )
        assert torch.allclose(torch.tensor(batch.logprobs[r]), expected, atol=1e-4)


def test_finish_reasons_lengths_and_texts(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    model, tok = policy
    batch = HFRolloutEngine(model, tok, show_progress=False).generate(
        prompts(tok), 8, SamplingParams(max_new_tokens=10), seed=0
    )
    assert set(batch.finish_reasons) == {"stop", "length"}
    for ids, reason, text, logp in zip(
        batch.completion_ids, batch.finish_reasons, batch.texts, batch.logprobs, strict=True
    ):
        assert len(ids) == len(logp)
        if reason == "stop":
            assert ids[-1] == tok.eos_token_id and tok.eos_token_id not in ids[:-1]
            assert text == tok.decode(ids[:-1], skip_special_tokens=True)
        else:
            assert len(ids) == 10 and tok.eos_token_id not in ids
            assert text == tok.decode(ids, skip_special_tokens=True)


def test_greedy_equals_argmax_continuation(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    model, tok = policy
    batch = HFRolloutEngine(model, tok, show_progress=False).generate(
        prompts(tok), 2, SamplingParams(max_new_tokens=12, temperature=0.0), seed=0
    )
    for r in range(len(batch)):
        ids = list(batch.prompt_ids[r])
        expected = []
        for _ in range(12):
            with torch.no_grad():
                nxt = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            expected.append(nxt)
            ids.append(nxt)
            if nxt == tok.eos_token_id:
                break
        assert batch.completion_ids[r] == expected
    assert batch.completion_ids[0] == batch.completion_ids[1]


def generate_greedy(
    model: PreTrainedModel, pad: int, prompt_ids: list[list[int]], stop_ids: list[int]
) -> list[list[int]]:
    """transformers' `generate(do_sample=False)` on left-padded prompts, each row cut after
    its first stop token."""
    ids, mask = rollout.left_padded(prompt_ids, pad)
    width = ids.shape[1]
    with torch.no_grad():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=False,
            max_new_tokens=16,
            eos_token_id=stop_ids,
            pad_token_id=pad,
        )
    rows = []
    for row in out[:, width:].tolist():
        ends = [t + 1 for t, token in enumerate(row) if token in stop_ids]
        rows.append(row[: ends[0]] if ends else row)
    return rows


def test_greedy_tokens_equal_transformers_generate(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    """The same tokens as `model.generate(do_sample=False)`, stop token included, on a
    left-padded batch of prompts of very different lengths: rows that run to the limit
    (the fixture's policy) and rows that stop after 1 or 7 tokens (EOS's output row made a
    near copy of the token that policy repeats)."""
    model, tok = policy
    params = SamplingParams(max_new_tokens=16, temperature=0.0)
    stopping = create_tiny_policy(PolicyConfig(seed=1), tok)
    free = HFRolloutEngine(stopping, tok, show_progress=False).generate(prompts(tok), 1, params, 0)
    with torch.no_grad():
        head = stopping.lm_head.weight
        noise = torch.randn(head.shape[1], generator=torch.Generator().manual_seed(0))
        head[tok.eos_token_id] = head[free.completion_ids[0][0]] + 0.05 * noise
    reasons = set()
    for m in (model, stopping):
        engine = HFRolloutEngine(m, tok, show_progress=False)
        ours = engine.generate(prompts(tok), 1, params, seed=0)
        theirs = generate_greedy(m, tok.pad_token_id, ours.prompt_ids, engine.stop_ids)
        assert ours.completion_ids == theirs
        reasons |= set(ours.finish_reasons)
        lengths = {len(c) for c in ours.completion_ids}
    assert reasons == {"stop", "length"} and len(lengths) > 1


def test_top_p_samples_only_from_the_nucleus() -> None:
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(1000, 1)
    tokens, logp = sample_tokens(
        logits,
        torch.rand(1000, generator=torch.Generator().manual_seed(0)),
        SamplingParams(top_p=0.8),
    )
    assert set(tokens.tolist()) == {0, 1}
    assert torch.allclose(logp[tokens == 1], torch.log(torch.tensor(0.3)))


def test_preallocated_cache_and_dropping_finished_rows_change_nothing(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decode fast path (one KV buffer per layer written in place, finished rows dropped
    from the batch) samples the same tokens with the same log-probs as the plain path
    (HF's concatenating DynamicCache, every row decoded to the end)."""
    model, tok = policy
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    engine = HFRolloutEngine(model, tok, batch_size=64, show_progress=False)
    drops: list[int] = []
    select = live_kv_cache.PreallocatedLayer.batch_select_indices

    def counted(layer: live_kv_cache.PreallocatedLayer, indices: torch.Tensor) -> None:
        drops.append(len(indices))
        select(layer, indices)

    monkeypatch.setattr(live_kv_cache.PreallocatedLayer, "batch_select_indices", counted)
    fast = engine.generate(prompts(tok), 8, params, seed=3)
    assert drops, "no finished rows were dropped: the test does not reach the fast path"
    monkeypatch.setattr(rollout, "preallocate_cache", lambda *_: False)
    monkeypatch.setattr(rollout, "FINISHED_DROP_SHARE", 2.0)  # never drop
    plain = engine.generate(prompts(tok), 8, params, seed=3)
    assert fast.completion_ids == plain.completion_ids
    assert fast.finish_reasons == plain.finish_reasons
    assert set(fast.finish_reasons) == {"stop", "length"}
    for a, b in zip(fast.logprobs, plain.logprobs, strict=True):
        assert torch.allclose(torch.tensor(a), torch.tensor(b), atol=1e-5)


@pytest.mark.parametrize("lean_decode", [True, False])
def test_a_cache_grown_block_by_block_samples_what_one_sized_up_front_does(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    monkeypatch: pytest.MonkeyPatch,
    lean_decode: bool,
) -> None:
    """A KV cache that grows by one position at a time (and is cut back as rows finish) gives
    bit-identical tokens and log-probs to one sized for the whole decode up front (the buffer
    before blocks), through our lean step and through the model's own forward."""
    model, tok = policy
    params = SamplingParams(max_new_tokens=24, temperature=1.0)
    engine = HFRolloutEngine(model, tok, batch_size=64, show_progress=False)
    engine.lean_decode = lean_decode
    batches = []
    for block in (10**6, 1):
        monkeypatch.setattr(rollout, "KV_BLOCK_TOKENS", block)
        batches.append(engine.generate(prompts(tok), 8, params, seed=3))
    up_front, grown = batches
    assert grown.completion_ids == up_front.completion_ids
    assert grown.logprobs == up_front.logprobs
    assert set(grown.finish_reasons) == {"stop", "length"}


def test_the_cache_holds_the_live_rows_and_at_most_a_block_more_positions(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each layer's buffer has the rows still decoding and their filled positions plus at
    most one block: it grows as decoding advances and shrinks as finished rows leave, never
    the chunk's rows x (prompt width + max_new_tokens) up front."""
    model, tok = policy
    block, steps = 4, 24
    monkeypatch.setattr(rollout, "KV_BLOCK_TOKENS", block)
    seen: list[tuple[int, int, int]] = []  # (rows, filled positions, capacity) after a step
    update = live_kv_cache.PreallocatedLayer.update

    def recorded(layer: live_kv_cache.PreallocatedLayer, *args: Any) -> tuple[torch.Tensor, ...]:
        out = update(layer, *args)
        seen.append((len(layer.keys), layer.get_seq_length(), layer.capacity))
        return out

    monkeypatch.setattr(live_kv_cache.PreallocatedLayer, "update", recorded)
    engine = HFRolloutEngine(model, tok, batch_size=64, show_progress=False)
    batch = engine.generate(prompts(tok), 8, SamplingParams(max_new_tokens=steps), seed=3)
    width = max(len(p) for p in batch.prompt_ids)
    assert all(filled <= capacity <= filled + block for _, filled, capacity in seen)
    assert seen[0][2] < width + steps  # not sized for the whole decode up front
    assert len({capacity for _, _, capacity in seen}) > 2  # it grew (and was cut back)
    assert seen[-1][0] < seen[0][0] == len(batch)  # finished rows left the buffers


def test_a_prompt_and_completion_past_the_models_context_is_refused_naming_the_fix() -> None:
    tok = build_char_tokenizer()
    short = create_tiny_policy(PolicyConfig(n_layers=1, max_position_embeddings=64), tok)
    engine = HFRolloutEngine(short, tok, show_progress=False, progress_label="evaluation")
    prompt = "1+2="  # BOS and 4 characters: 5 tokens of the character tokenizer
    assert len(engine.generate([prompt], 1, SamplingParams(max_new_tokens=59), 0)) == 1
    with pytest.raises(SettingError) as err:
        engine.generate([prompt], 1, SamplingParams(max_new_tokens=60), 0)
    assert str(err.value) == (
        "evaluation: a 5-token prompt + max_new_tokens 60 exceeds the policy's context "
        "(max_position_embeddings = 64): lower that stage's max_new_tokens, shorten the "
        "prompts, or use a policy with a longer context"
    )


@settings(max_examples=40, deadline=None)
@given(
    rows=st.integers(1, 40),
    steps=st.integers(1, 300),
    chunk=st.integers(1, 16),
    cut=st.tuples(st.integers(0, 40), st.integers(0, 40)),
)
def test_uniforms_drawn_chunk_by_chunk_are_the_rows_of_one_draw(
    rows: int, steps: int, chunk: int, cut: tuple[int, int]
) -> None:
    """What keeps a row's draws independent of the batch size and of a shard's first row."""
    start, stop = sorted(min(c, rows) for c in cut)
    whole = torch.rand(rows, steps, generator=torch.Generator().manual_seed(7))
    chunks = list(rollout.row_uniforms(7, steps, start, stop, chunk))
    assert all(len(c) <= chunk for c in chunks)
    drawn = torch.cat(chunks) if chunks else torch.empty(0, steps)
    assert torch.equal(drawn, whole[start:stop])
