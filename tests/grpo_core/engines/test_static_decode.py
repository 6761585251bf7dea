"""The static-cache decode loop (engines.hf.cache_implementation: static, engines.hf.compile):
the tokens and log-probs of today's dynamic loop, eager or compiled."""

from __future__ import annotations

import logging

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from transformers import (
    CompileConfig,
    PreTrainedModel,
    PreTrainedTokenizerBase,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.engines import static_decode
from grpo_core.engines.config import HFSettings
from grpo_core.engines.hf_generate import HFGenerateEngine
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.registry import ROLLOUT_ENGINES, RolloutRequest
from grpo_core.engines.static_decode import (
    CAPACITY_BLOCK,
    StaticCacheRolloutEngine,
    capacity_bucket,
    rows_bucket,
)
from tests.grpo_core.engines.test_hf_rollout import policy, prompts, recomputed_logprobs

__all__ = ["policy"]  # the module fixture, shared
pytestmark = pytest.mark.usefixtures("one_torch_thread")

PARAMS = [
    SamplingParams(max_new_tokens=24, temperature=1.0),
    SamplingParams(max_new_tokens=24, temperature=0.7, top_p=0.8),
    SamplingParams(max_new_tokens=24, temperature=0.0),
]
IDS = ["t1", "t0.7-top_p0.8", "greedy"]
# dynamo's graph capture without code generation: the compiled path in seconds, not a minute
CAPTURE_ONLY = CompileConfig(backend="aot_eager", dynamic=False, mode=None)


def assert_same_rollouts(got: RolloutBatch, want: RolloutBatch) -> None:
    """Tokens, finish reasons and texts identical; log-probs equal to float round-off."""
    assert got.completion_ids == want.completion_ids
    assert got.finish_reasons == want.finish_reasons and got.texts == want.texts
    for x, y in zip(got.logprobs, want.logprobs, strict=True):
        torch.testing.assert_close(torch.tensor(x), torch.tensor(y), atol=1e-5, rtol=1e-5)


def assert_logprobs_of_a_forward_pass(
    model: PreTrainedModel, batch: RolloutBatch, temperature: float
) -> None:
    for r in range(len(batch)):
        expected = recomputed_logprobs(
            model, batch.prompt_ids[r], batch.completion_ids[r], temperature or 1.0
        )
        torch.testing.assert_close(torch.tensor(batch.logprobs[r]), expected, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("params", PARAMS, ids=IDS)
@pytest.mark.parametrize("batch_size", [4, 8])
def test_static_cache_samples_what_the_dynamic_loop_samples(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    params: SamplingParams,
    batch_size: int,
) -> None:
    """9 rows in chunks of 4, 4 and 1 or of 8 and 1 (chunks that split a prompt's samples):
    the rows of the dynamic cache, whose finished rows leave the batch where here they decode
    to the end."""
    model, tok = policy
    dynamic = HFRolloutEngine(model, tok, batch_size, show_progress=False)
    static = StaticCacheRolloutEngine(model, tok, batch_size, show_progress=False)
    want = dynamic.generate(prompts(tok), 3, params, seed=5)
    got = static.generate(prompts(tok), 3, params, seed=5)
    assert_same_rollouts(got, want)
    if params.temperature == 1.0:  # rows that stopped and rows cut at max_new_tokens
        assert {"stop", "length"} <= set(got.finish_reasons)
    assert_logprobs_of_a_forward_pass(model, got, params.temperature)


def test_padding_rows_do_not_change_the_rows_decoded(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    """6 rows decode in a static cache of 8 (2 padding rows): the rows of a batch of 6."""
    model, tok = policy
    params = SamplingParams(max_new_tokens=16, temperature=1.0)
    static = StaticCacheRolloutEngine(model, tok, 8, show_progress=False)
    want = HFRolloutEngine(model, tok, 8, show_progress=False).generate(prompts(tok), 2, params, 3)
    assert_same_rollouts(static.generate(prompts(tok), 2, params, seed=3), want)
    assert list(static._caches) == [8]


@pytest.mark.parametrize("params", PARAMS, ids=IDS)
def test_compiled_step_samples_what_the_eager_step_samples(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], params: SamplingParams
) -> None:
    """The decode step through torch.compile (dynamo's capture, aot_eager): the same rows as
    eager, and a second call of the same shapes compiles nothing new (the kept cache and
    graph are reused)."""
    model, tok = policy
    eager = StaticCacheRolloutEngine(model, tok, 8, show_progress=False)
    compiled = StaticCacheRolloutEngine(model, tok, 8, show_progress=False, compile=CAPTURE_ONLY)
    torch._dynamo.reset()  # compiled graphs of earlier tests would be reused
    frames = torch._dynamo.utils.counters["frames"]
    before = frames["ok"]
    got = compiled.generate(prompts(tok), 2, params, seed=5)
    assert frames["ok"] > before, "the decode step was not compiled"
    assert_same_rollouts(got, eager.generate(prompts(tok), 2, params, seed=5))
    compiled_so_far = frames["ok"]
    again = compiled.generate(prompts(tok), 2, params, seed=6)
    assert frames["ok"] == compiled_so_far
    assert_same_rollouts(again, eager.generate(prompts(tok), 2, params, seed=6))


@pytest.mark.slow
def test_inductor_compiled_step_samples_what_the_dynamic_loop_samples(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    """engines.hf.compile as a run sets it on CPU (inductor, C++ code generated with gcc;
    ~1 min): greedy tokens identical, sampled log-probs those of a forward pass."""
    model, tok = policy
    compiled = StaticCacheRolloutEngine(model, tok, 8, show_progress=False, compile=True)
    dynamic = HFRolloutEngine(model, tok, 8, show_progress=False)
    for params in (PARAMS[2], PARAMS[0]):
        got = compiled.generate(prompts(tok), 2, params, seed=5)
        assert_same_rollouts(got, dynamic.generate(prompts(tok), 2, params, seed=5))
        assert_logprobs_of_a_forward_pass(model, got, params.temperature)


@pytest.mark.parametrize("compile", [False, True])
def test_generate_over_a_static_cache_samples_what_the_dynamic_loop_samples(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
    compile: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """hf_generate with transformers' static cache; compile on CPU is said in the log and
    decodes uncompiled (transformers compiles generate on GPUs only)."""
    model, tok = policy
    params = PARAMS[0]
    want = HFRolloutEngine(model, tok, 4, show_progress=False).generate(prompts(tok), 3, params, 5)
    engine = HFGenerateEngine(
        model, tok, 4, show_progress=False, cache_implementation="static", compile=compile
    )
    static_decode._SAID.clear()
    with caplog.at_level(logging.WARNING, logger=static_decode.__name__):
        got = engine.generate(prompts(tok), 3, params, seed=5)
    assert_same_rollouts(got, want)
    said = [r.message for r in caplog.records if "hf_generate" in r.message]
    assert len(said) == (1 if compile else 0)  # once, though every chunk asked


def sliding_window_model(vocab: int) -> PreTrainedModel:
    config = Qwen2Config(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_sliding_window=True,
        sliding_window=8,
        max_window_layers=0,
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config).eval()


def test_a_model_the_static_cache_cannot_hold_decodes_with_the_dynamic_cache(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], caplog: pytest.LogCaptureFixture
) -> None:
    """Sliding-window layers: the run says so once and samples what the dynamic loop does."""
    tok = policy[1]
    model = sliding_window_model(len(tok))
    params = PARAMS[0]
    static_decode._SAID.clear()
    with caplog.at_level(logging.WARNING, logger=static_decode.__name__):
        got = StaticCacheRolloutEngine(model, tok, 4, show_progress=False, compile=True).generate(
            prompts(tok), 3, params, seed=1
        )
    want = HFRolloutEngine(model, tok, 4, show_progress=False).generate(prompts(tok), 3, params, 1)
    assert_same_rollouts(got, want)
    said = [r.message for r in caplog.records]
    assert len(said) == 1 and "other than full attention" in said[0] and "uncompiled" in said[0]


def test_compile_without_the_static_cache_is_refused(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    model, tok = policy
    with pytest.raises(ValueError, match="cache_implementation = static"):
        HFGenerateEngine(model, tok, compile=True)
    with pytest.raises(ValueError, match=r"engines\.hf\.cache_implementation: static"):
        HFSettings(compile=True)


@pytest.mark.parametrize("name", ["hf", "hf_generate"])
def test_both_in_process_engines_take_engines_hf(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase], name: str, tmp_path: object
) -> None:
    from flows.engines_config import EnginesSection

    model, tok = policy
    section = EnginesSection(hf=HFSettings(cache_implementation="static"))
    settings = section.settings_of(name)
    assert settings is section.hf
    request = RolloutRequest(checkpoint_dir=tmp_path, tokenizer=tok, model=model)  # type: ignore[arg-type]
    engine = ROLLOUT_ENGINES[name].build(request, settings)
    assert getattr(engine, "cache_implementation", "dynamic") == "static"
    default = ROLLOUT_ENGINES[name].build(request, EnginesSection().settings_of(name))
    assert getattr(default, "cache_implementation", "dynamic") == "dynamic"


@given(rows=st.integers(1, 600), batch_size=st.integers(1, 600))
def test_rows_bucket_is_a_power_of_two_or_the_batch_size(rows: int, batch_size: int) -> None:
    bucket = rows_bucket(rows, batch_size)
    assert bucket >= rows
    if rows <= batch_size:
        assert bucket <= batch_size and bucket < 2 * rows
        assert bucket == batch_size or bucket & (bucket - 1) == 0


@given(tokens=st.integers(1, 20_000))
def test_capacity_bucket_is_the_next_block(tokens: int) -> None:
    capacity = capacity_bucket(tokens)
    assert capacity % CAPACITY_BLOCK == 0 and tokens <= capacity < tokens + CAPACITY_BLOCK


def test_close_frees_the_kept_caches(
    policy: tuple[PreTrainedModel, PreTrainedTokenizerBase],
) -> None:
    model, tok = policy
    engine = StaticCacheRolloutEngine(model, tok, 4, show_progress=False)
    engine.generate(prompts(tok), 3, PARAMS[0], seed=0)  # chunks of 4, 4 and 1 rows
    assert sorted(engine._caches) == [1, 4]
    engine.close()
    assert engine._caches == {}
