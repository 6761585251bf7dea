"""The hf_generate engine: transformers' generate drives the decoding, our draws pick the
tokens, so it samples what the hf engine samples for the same seed."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.hf_generate import HFGenerateEngine
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.registry import ROLLOUT_ENGINES, RolloutRequest
from tests.grpo_core.engines.test_hf_rollout import policy, prompts, recomputed_logprobs

__all__ = ["policy"]  # the module fixture, shared


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(max_new_tokens=24, temperature=1.0),
        SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.8),
        SamplingParams(max_new_tokens=24, temperature=0.0),
    ],
    ids=["t1", "t0.7-top_p0.8", "greedy"],
)
def test_generate_engine_samples_what_the_lean_loop_samples(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], params: SamplingParams
) -> None:
    model, tok = policy
    lean = HFRolloutEngine(model, tok, batch_size=4, show_progress=False)
    generate = HFGenerateEngine(model, tok, batch_size=4, show_progress=False)
    a = lean.generate(prompts(tok), 3, params, seed=5)
    b = generate.generate(prompts(tok), 3, params, seed=5)
    assert b.completion_ids == a.completion_ids
    assert b.finish_reasons == a.finish_reasons and b.texts == a.texts
    if params.temperature == 1.0:  # rows that stopped and rows cut at max_new_tokens
        assert {"stop", "length"} <= set(a.finish_reasons)
    for x, y in zip(a.logprobs, b.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(y), torch.tensor(x), atol=1e-5, rtol=1e-5)
    # the recorded log-probs are those of the distribution sampled from, as the lean loop's
    temperature = params.temperature or 1.0
    row = next(r for r, ids in enumerate(b.completion_ids) if len(ids) > 3)
    expected = recomputed_logprobs(model, b.prompt_ids[row], b.completion_ids[row], temperature)
    torch.testing.assert_close(torch.tensor(b.logprobs[row]), expected, atol=1e-4, rtol=1e-4)


def test_generate_engine_shards_take_the_rows_of_the_whole_call(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    model, tok = policy
    engine = HFGenerateEngine(model, tok, batch_size=3, show_progress=False)
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    whole = engine.generate(prompts(tok), 3, params, seed=9)
    part = engine.generate(prompts(tok), 3, params, seed=9, rows=(3, 9))
    assert part.completion_ids == whole.completion_ids[3:9]
    assert part.prompt_index == whole.prompt_index[3:9]


def test_registry_builds_the_generate_engine_by_name(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], tmp_path
) -> None:
    model, tok = policy
    request = RolloutRequest(tmp_path, tok, model=model, batch_size=2, show_progress=False)
    spec = ROLLOUT_ENGINES["hf_generate"]
    assert spec.capabilities(None).shares_model
    assert type(spec.build(request, None)) is HFGenerateEngine
    assert type(ROLLOUT_ENGINES["hf"].build(request, None)) is HFRolloutEngine


def test_the_models_own_generation_config_changes_nothing(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    """Penalties, suppressed tokens or sampling flags in the model's generation config would
    change the scores our draws read: the engine decodes with a plain config of its own."""
    model, tok = policy
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    plain = HFGenerateEngine(model, tok, batch_size=4, show_progress=False)
    want = plain.generate(prompts(tok), 2, params, seed=3)
    saved = model.generation_config
    model.generation_config = copy.deepcopy(saved)
    digit = tok.convert_tokens_to_ids("1")
    for name, value in {
        "repetition_penalty": 3.0,
        "suppress_tokens": [digit],
        "do_sample": True,
        "top_k": 2,
        "no_repeat_ngram_size": 2,
    }.items():
        setattr(model.generation_config, name, value)
    try:
        got = HFGenerateEngine(model, tok, batch_size=4, show_progress=False).generate(
            prompts(tok), 2, params, seed=3
        )
    finally:
        model.generation_config = saved
    assert got.completion_ids == want.completion_ids
    assert any(digit in ids for ids in want.completion_ids)  # the suppressed token is drawn
