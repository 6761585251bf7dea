"""grpo.algo.padding_free gives the gradients and metrics of one padded micro-batch holding
every row (fp32; gradients within atol 1e-6 + rtol 1e-5, metrics within 1e-5) in the policy
update (every loss mode, fixed rows or a token budget, G samples per prompt, merged copies,
checkpointing and chunked logits, LoRA, two ranks), PPO's critic and DPO; every pass is one
packed row, the budget bounds its tokens, and padding_share is the share computed: 0. On CUDA
(`make gpu-check`): sdpa's packed update, and flash_attention_2's varlen log-probs in bf16."""

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_core.algo.config import GRPOConfig, LossAgg
from grpo_core.algo.critic_update import CriticLearner
from grpo_core.algo.update import grpo_update
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.model.checkpointing import transformers_model
from grpo_core.model.critic import ValueModel
from grpo_core.model.forward import sequence_logprobs
from tests.grpo_core.algo.test_dpo_update import DPO, pair_batch
from tests.grpo_core.algo.test_token_budget import METRICS, model, spread_batch
from tests.grpo_core.algo.test_update import MODES, batch_with_copies
from tests.grpo_core.engines import test_deepspeed_engine as deepspeed_tests
from tests.models import tiny_llama
from tests.recording_engine import RecordingEngine, assert_same_gradients

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def passes(module: torch.nn.Module) -> list[tuple[int, ...]]:
    """The input_ids shape of each forward of `module`, and whether it had a mask (a causal
    LM's decoder runs in every pass, chunked logits or not)."""
    seen: list[tuple[int, ...]] = []

    def record(_: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        seen.append((*kwargs["input_ids"].shape, int(kwargs.get("attention_mask") is not None)))

    module.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def update(
    batch: Any, advantages: torch.Tensor, cfg: GRPOConfig, old: torch.Tensor | None = None
) -> tuple[RecordingEngine, list[tuple[int, ...]], dict[str, float]]:
    engine = RecordingEngine(model())
    seen = passes(engine.model.get_decoder())
    metrics = grpo_update(
        engine, model(seed=1), batch, advantages, cfg, old, torch.Generator().manual_seed(0)
    )
    return engine, seen, metrics


def assert_same_update(
    batch: Any,
    advantages: torch.Tensor,
    cfg: GRPOConfig,
    old: torch.Tensor | None = None,
    **packed: Any,
) -> list[tuple[int, ...]]:
    """The update with padding_free and `packed`'s settings against one padded pass of every
    row; the packed run's passes."""
    whole = cfg.model_copy(update={"micro_batch_size": len(batch)})
    expected_engine, _, expected = update(batch, advantages, whole, old)
    engine, seen, metrics = update(
        batch, advantages, cfg.model_copy(update={"padding_free": True, **packed}), old
    )
    assert_same_gradients(engine.grads, expected_engine.grads, atol=1e-6)
    for key in METRICS:
        assert metrics[key] == pytest.approx(expected[key], abs=1e-5), key
    assert metrics["padding_share"] == 0.0 and expected["padding_share"] > 0.3
    assert seen and all(rows == 1 and not masked for rows, _, masked in seen)
    return seen


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shared_prompts", [False, True])
@pytest.mark.parametrize("micro", [{"micro_batch_size": 3}, {"max_tokens_per_micro_batch": 120}])
def test_packed_passes_give_the_one_batch_gradient(
    mode: LossAgg, shared_prompts: bool, micro: dict[str, int]
) -> None:
    batch, advantages = spread_batch(shared_prompts)
    cfg = GRPOConfig(loss_agg=mode, mu=2, beta=0.1, max_len_norm=90)
    seen = assert_same_update(batch, advantages, cfg, **micro)
    lengths = batch.attention_mask.sum(-1).tolist()
    if "max_tokens_per_micro_batch" in micro:  # the budget bounds the packed tokens
        assert all(tokens <= 120 or tokens == max(lengths) for _, tokens, _ in seen)
        assert len(seen) < 2 * len(lengths)  # several rows per pass


@pytest.mark.parametrize("mode", MODES)
def test_packed_passes_with_checkpointing_and_chunked_logits(mode: LossAgg) -> None:
    batch, advantages = spread_batch(shared_prompts=True)
    cfg = GRPOConfig(loss_agg=mode, mu=2, beta=0.1, max_len_norm=90)
    assert_same_update(
        batch,
        advantages,
        cfg,
        max_tokens_per_micro_batch=150,
        gradient_checkpointing=True,
        logits_chunk_tokens=16,
    )


@pytest.mark.parametrize("mode", MODES)
def test_packed_passes_give_the_one_batch_clipping_and_kl(mode: LossAgg) -> None:
    batch, advantages = spread_batch(shared_prompts=False)
    with torch.no_grad():
        current = sequence_logprobs(model(), batch)
    noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(2))
    sampling = (current + 0.3 * noise) * batch.response_mask  # some ratios clip
    cfg = GRPOConfig(loss_agg=mode, beta=0.1, max_len_norm=90, use_sampling_logprobs_as_old=True)
    _, _, metrics = update(
        batch, advantages, cfg.model_copy(update={"padding_free": True}), sampling
    )
    assert metrics["clip_frac_low"] > 0 and metrics["clip_frac_high"] > 0
    assert_same_update(batch, advantages, cfg, sampling, max_tokens_per_micro_batch=150)


@pytest.mark.parametrize("mode", MODES)
def test_identical_rows_merge_across_packed_passes(mode: LossAgg) -> None:
    batch, advantages = batch_with_copies()  # left-padded, copies in scattered slots
    cfg = GRPOConfig(loss_agg=mode, mu=2, beta=0.1, max_len_norm=7)
    assert_same_update(batch, advantages, cfg, max_tokens_per_micro_batch=16)


def test_packed_critic_gives_the_one_batch_values_and_gradients(tmp_path: Path) -> None:
    batch, _ = spread_batch(shared_prompts=False)
    model().save_pretrained(tmp_path / "policy")
    scores = torch.randn(8, generator=torch.Generator().manual_seed(1))
    runs = []
    for micro in ({"micro_batch_size": 8}, {"max_tokens_per_micro_batch": 120, "padding_free": 1}):
        cfg = GRPOConfig.model_validate(
            {"adv_estimator": "ppo", "beta": 0.0, "mu": 2, "mini_batches_per_epoch": 2, **micro}
        )
        critic = ValueModel.from_backbone(tmp_path / "policy")
        engine = RecordingEngine(critic)
        seen = passes(critic.net)
        learner = CriticLearner(critic, engine, model(seed=3), model(seed=4), cfg)
        terms = learner.prepare(batch)
        metrics = learner.update(batch, terms, scores, seed=0)
        runs.append((terms, engine.grads, metrics))
        assert all(rows == 1 for rows, _, _ in seen) == ("padding_free" in micro)
    (whole, whole_grads, expected), (packed, grads, metrics) = runs
    assert torch.allclose(whole.values, packed.values, atol=1e-6)
    assert torch.allclose(whole.log_ratio, packed.log_ratio, atol=1e-5)
    assert float(packed.log_ratio.abs().sum()) > 0
    assert_same_gradients(grads, whole_grads, atol=1e-6)
    for key in ("value_loss", "value_clipfrac", "value_mean", "returns_mean", "reward_kl"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-5), key


def test_packed_dpo_passes_give_the_padded_gradient() -> None:
    batch, advantages = pair_batch()
    runs = []
    for padding_free in (False, True):
        cfg = GRPOConfig(**DPO, micro_batch_size=4, padding_free=padding_free)
        engine = RecordingEngine(model())
        seen = passes(engine.model.get_decoder())
        metrics = grpo_update(engine, model(seed=1), batch, advantages, cfg)
        assert all(rows == 1 for rows, _, _ in seen) == padding_free
        runs.append((engine.grads, metrics))
    (want, expected), (got, metrics) = runs
    assert_same_gradients(got, want, atol=1e-6)
    assert metrics["dpo_loss"] == pytest.approx(expected["dpo_loss"], abs=1e-6)


def test_packed_passes_through_lora_adapters_give_the_padded_gradient() -> None:
    pytest.importorskip("peft", reason="the lora extra is not installed")
    from grpo_core.model.config import LoRAConfig
    from grpo_core.model.lora import LoRAAdapters

    batch, advantages = spread_batch(shared_prompts=True)
    runs = []
    for padding_free in (False, True):
        policy = model()
        adapters = LoRAAdapters(policy, LoRAConfig(enabled=True, r=2, alpha=4), seed=0)
        with torch.no_grad():  # adapters as after some training, B != 0
            for p in adapters.trainable():
                p.normal_(0.0, 0.2, generator=torch.Generator().manual_seed(p.numel()))
        engine = RecordingEngine(policy)
        seen = passes(policy.get_decoder())
        cfg = GRPOConfig(mu=2, beta=0.0, padding_free=padding_free, max_tokens_per_micro_batch=120)
        grpo_update(engine, None, batch, advantages, cfg, None, torch.Generator().manual_seed(0))
        assert all(rows == 1 for rows, _, _ in seen) == padding_free
        runs.append(engine.grads)
    assert_same_gradients(runs[1], runs[0], atol=1e-6)


def test_two_ranks_of_packed_passes_add_up_to_the_one_process_gradient() -> None:
    """Each rank plans every rank's packed passes, so both run as many (a rank with fewer
    pads with a pass that has no loss) and their gradients sum to one padded process's."""
    batch, advantages = spread_batch(shared_prompts=True)
    cfg = GRPOConfig(mu=1, beta=0.1, max_len_norm=90)
    one = RecordingEngine(model())
    grpo_update(one, model(seed=1), batch, advantages, cfg)
    packed = cfg.model_copy(update={"padding_free": True, "max_tokens_per_micro_batch": 100})
    summed: list[torch.Tensor] | None = None
    counts = []
    for rank in (0, 1):
        engine = RecordingEngine(model())
        engine.data_parallel_size, engine.data_parallel_rank = 2, rank
        seen = passes(engine.model.get_decoder())
        grpo_update(engine, model(seed=1), batch, advantages, packed)
        counts.append(sum(1 for rows, _, _ in seen if rows == 1))
        (grads,) = engine.grads
        summed = grads if summed is None else [a + b for a, b in zip(summed, grads, strict=True)]
    assert summed is not None
    assert counts[0] == counts[1] > 1  # as many packed passes on both ranks
    assert_same_gradients([summed], one.grads, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_passes_on_cuda_give_the_padded_gradient(mode: LossAgg) -> None:
    """sdpa on CUDA (its kernels take the packed row's boolean mask), fp32."""
    batch, advantages = spread_batch(shared_prompts=True)
    batch, advantages = batch.to("cuda"), advantages.cuda()
    grads = []
    for padding_free in (False, True):
        engine = RecordingEngine(model().cuda())
        cfg = GRPOConfig(
            loss_agg=mode,
            mu=2,
            beta=0.1,
            max_len_norm=90,
            max_tokens_per_micro_batch=120,
            padding_free=padding_free,
        )
        generator = torch.Generator().manual_seed(0)
        grpo_update(engine, model(seed=1).cuda(), batch, advantages, cfg, None, generator)
        grads.append(engine.grads)
    assert_same_gradients(grads[1], grads[0], atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_packed_rows_under_flash_attention_2_give_the_padded_logprobs() -> None:
    """flash_attention_2's varlen kernel over the packed row against its padded pass, bf16
    (the kernel takes no fp32): log-probs within bf16 rounding, gradients in one direction."""
    pytest.importorskip("flash_attn", reason="flash_attention_2 needs the flash-attn package")
    batch, _ = spread_batch(shared_prompts=False)
    batch = batch.to("cuda")
    results = []
    for packed in (False, True):
        policy = model().to("cuda", torch.bfloat16)
        policy.set_attn_implementation("flash_attention_2")
        logp = sequence_logprobs(policy, batch, packed=packed)
        logp.sum().backward()
        grad = torch.cat([p.grad.flatten().float() for p in policy.parameters()])
        results.append((logp.detach(), grad))
    (padded, padded_grad), (packed_logp, packed_grad) = results
    assert torch.allclose(packed_logp, padded, atol=5e-2)
    assert torch.nn.functional.cosine_similarity(packed_grad, padded_grad, dim=0) > 0.99


def test_packed_passes_through_deepspeed_match_the_padded_torch_engine() -> None:
    """DeepSpeed's engine forwards the packed row's keywords: ZeRO-2 in process, packed,
    makes the padded TorchEngine's update (tests/grpo_core/engines/test_deepspeed_engine.py's
    tolerances)."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed")
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    batch, advantages = deepspeed_tests.ragged_batch(8)
    cfg = deepspeed_tests.CFG.model_copy(update={"micro_batch_size": 3})
    expected, torch_metrics = deepspeed_tests.torch_update(cfg, batch, advantages)
    packed = cfg.model_copy(update={"padding_free": True})
    engine = DeepSpeedEngine(
        tiny_llama(), packed.optimizer_settings(), config=DeepSpeedConfig(zero_stage=2)
    )
    inner = transformers_model(engine.model)
    assert inner is not None
    seen = passes(inner.get_decoder())
    generator = deepspeed_tests.seeded()
    metrics = grpo_update(
        engine, tiny_llama(seed=1), batch, advantages, packed, generator=generator
    )
    assert seen and all(rows == 1 and not masked for rows, _, masked in seen)
    gap = deepspeed_tests.max_param_gap(expected, engine.full_state_dict())
    moved = deepspeed_tests.max_param_gap(expected, tiny_llama().state_dict())
    deepspeed_tests.assert_same_update(torch_metrics, metrics, gap, moved)
