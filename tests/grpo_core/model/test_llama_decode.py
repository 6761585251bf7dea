"""The lean Llama decode step against transformers' own forward: same logits to float
round-off (GQA, left padding, bfloat16), the same tokens through the rollout engine, and HF's
forward kept for every model the step does not reproduce."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedModel
from transformers.cache_utils import DynamicCache

from grpo_core.contracts.rollout import SamplingParams
from grpo_core.engines.hf_rollout import HFRolloutEngine, left_padded
from grpo_core.engines.live_kv_cache import preallocate_cache
from grpo_core.model.config import PolicyConfig
from grpo_core.model.kv_cache import returned_cache
from grpo_core.model.llama_decode import llama_decoder
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from grpo_core.model.prompts import Prompter

TOKENIZER = build_char_tokenizer()
PROMPTS = [[1, 5, 9, 7], [1, 6, 8, 10, 12, 7, 5], [1, 4]]  # left padding of 3, 0 and 5


def llama(
    kv_heads: int = 2, dtype: torch.dtype = torch.float32, **extra: object
) -> LlamaForCausalLM:
    config = LlamaConfig(
        vocab_size=len(TOKENIZER),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        max_position_embeddings=64,
        **extra,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype)
    with torch.no_grad():  # weights large enough that every layer moves the logits
        for param in model.parameters():
            param.mul_(4 if param.dim() > 1 else 1)
    return model.eval()


def prefilled(
    model: PreTrainedModel, steps: int
) -> tuple[DynamicCache, torch.Tensor, torch.Tensor]:
    """The left-padded prompts' preallocated cache, their mask and positions."""
    ids, mask = left_padded(PROMPTS, TOKENIZER.pad_token_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.inference_mode():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
    cache = returned_cache(out)
    assert isinstance(cache, DynamicCache)
    assert preallocate_cache(cache, torch.arange(len(PROMPTS)), ids.shape[1] + steps)
    return cache, mask, positions[:, -1]


@pytest.mark.parametrize(
    ("kv_heads", "dtype", "tolerance"),
    [(4, torch.float32, 1e-5), (2, torch.float32, 1e-5), (1, torch.bfloat16, 0.02)],
)
def test_each_step_gives_the_logits_of_the_model_forward(
    kv_heads: int, dtype: torch.dtype, tolerance: float
) -> None:
    model = llama(kv_heads, dtype)
    steps = 5
    ours_cache, mask, last = prefilled(model, steps)
    theirs_cache, _, _ = prefilled(model, steps)
    decoder = llama_decoder(model, ours_cache.layers)
    assert decoder is not None
    tokens = torch.tensor([11, 13, 15])
    for t in range(steps):
        mask = torch.cat([mask, torch.ones(len(PROMPTS), 1, dtype=mask.dtype)], dim=1)
        position = last + 1 + t
        ours = decoder.step(tokens, position, ours_cache.layers, mask)
        with torch.inference_mode():
            out = model(
                input_ids=tokens[:, None],
                attention_mask=mask,
                position_ids=position[:, None],
                cache=theirs_cache,
                use_cache=True,
            )
        theirs = out.logits[:, -1]
        scale = theirs.float().abs().max()
        assert scale > 1  # the comparison is not of near-zero logits
        assert torch.allclose(ours.float(), theirs.float(), atol=tolerance * scale, rtol=0)
        tokens = theirs.argmax(-1)


def test_the_engine_samples_the_same_tokens_with_and_without_it() -> None:
    model = create_tiny_policy(PolicyConfig(seed=3, n_kv_heads=2), TOKENIZER)
    prompts = [Prompter(TOKENIZER)(q) for q in ["3", "3+4-2", "1+2-3+4-5+6-7+8"]]
    for temperature in (0.0, 1.0):
        params = SamplingParams(max_new_tokens=20, temperature=temperature)
        batches = [
            HFRolloutEngine(model, TOKENIZER, 5, show_progress=False, lean_decode=lean).generate(
                prompts, 4, params, seed=7
            )
            for lean in (True, False)
        ]
        assert batches[0].completion_ids == batches[1].completion_ids
        for ours, theirs in zip(batches[0].logprobs, batches[1].logprobs, strict=True):
            assert ours == pytest.approx(theirs, abs=1e-5)


def test_the_step_follows_weights_changed_in_place_after_a_new_decoder() -> None:
    model = llama()
    cache, _, _ = prefilled(model, 2)
    before = llama_decoder(model, cache.layers)
    with torch.no_grad():
        model.model.layers[0].self_attn.k_proj.weight.mul_(-1)
    after = llama_decoder(model, cache.layers)
    assert before is not None and after is not None
    assert not torch.equal(before.qkv[0], after.qkv[0])
    assert torch.equal(after.qkv[0][64:96], model.model.layers[0].self_attn.k_proj.weight)


@pytest.mark.parametrize(
    "changed", [{"attention_bias": True}, {"mlp_bias": True}, {"hidden_act": "gelu"}]
)
def test_models_it_does_not_reproduce_keep_the_model_forward(changed: dict[str, object]) -> None:
    model = llama(**changed)
    cache, _, _ = prefilled(model, 2)
    assert llama_decoder(model, cache.layers) is None


def test_a_subclass_or_a_cache_of_other_layers_keeps_the_model_forward() -> None:
    class Custom(LlamaForCausalLM):
        pass

    model = llama()
    cache, _, _ = prefilled(model, 2)
    custom = Custom(model.config)
    assert llama_decoder(custom, cache.layers) is None
    assert llama_decoder(model, cache.layers[:-1]) is None
    assert llama_decoder(model, [object()] * 3) is None


def test_parameters_partitioned_away_keep_the_model_forward() -> None:
    model = llama()
    cache, _, _ = prefilled(model, 2)
    weight = model.model.layers[1].mlp.up_proj.weight
    weight.ds_id = 7  # type: ignore[attr-defined]  # how DeepSpeed ZeRO-3 marks its parameters
    assert llama_decoder(model, cache.layers) is None
    del weight.ds_id  # type: ignore[attr-defined]
    assert llama_decoder(model, cache.layers) is not None
    weight.data = weight.data.new_empty(0)  # a ZeRO-3 placeholder outside its gather
    assert llama_decoder(model, cache.layers) is None
