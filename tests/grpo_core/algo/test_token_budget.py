"""Token-budget micro-batches give the gradients and metrics of one micro-batch holding every
row, in the policy update and in PPO's critic (fp32; gradients within atol 1e-6 + rtol 1e-5,
metrics within 1e-5): every loss mode, rows of very different lengths, G samples per prompt
(the shared-prompt forward), copies merged across packed passes."""

from pathlib import Path
from typing import Any

import pytest
import torch

from grpo_core.algo.config import GRPOConfig, LossAgg
from grpo_core.algo.critic_update import CriticLearner
from grpo_core.algo.micro_batches import padding_share, plan_micro_batches, row_lengths
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.model.checkpointing import is_checkpointing
from grpo_core.model.critic import ValueModel
from grpo_core.model.forward import sequence_logprobs
from tests.grpo_core.algo.test_update import MODES, batch_with_copies
from tests.models import tiny_llama
from tests.recording_engine import RecordingEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

COMPLETION_LENGTHS = [0, 3, 40, 7, 90, 1, 25, 60]
METRICS = (
    "loss",
    "policy_loss",
    "kl",
    "entropy",
    "clip_frac_low",
    "clip_frac_high",
    "approx_kl_old",
    "ratio_mean",
    "response_length",
    "zero_adv_seq_frac",
)


def model(seed: int = 0) -> torch.nn.Module:
    return tiny_llama(seed=seed, positions=128)


def spread_batch(shared_prompts: bool) -> tuple[PolicyBatch, torch.Tensor]:
    """Eight outputs of 0 to 90 tokens: each under its own prompt, or two prompts' G = 4."""
    gen = torch.Generator().manual_seed(5)
    prompts = [torch.randint(1, 12, (1 + i % 3,), generator=gen).tolist() for i in range(8)]
    if shared_prompts:
        prompts = [prompts[i // 4] for i in range(8)]
    completions = [torch.randint(0, 12, (n,), generator=gen).tolist() for n in COMPLETION_LENGTHS]
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="right")
    return batch, batch.expand_per_sequence(torch.randn(8, generator=gen))


def run(
    batch: PolicyBatch, advantages: torch.Tensor, cfg: GRPOConfig, old: torch.Tensor | None = None
) -> tuple[list[torch.Tensor], dict[str, float]]:
    engine = RecordingEngine(model())
    metrics = grpo_update(
        engine, model(seed=1), batch, advantages, cfg, old, torch.Generator().manual_seed(0)
    )
    return engine.grads[0], metrics


def assert_same_update(
    batch: PolicyBatch,
    advantages: torch.Tensor,
    cfg: GRPOConfig,
    budget: int,
    old: torch.Tensor | None = None,
) -> None:
    whole = cfg.model_copy(update={"micro_batch_size": len(batch)})
    packed = cfg.model_copy(update={"max_tokens_per_micro_batch": budget})
    expected_grads, expected = run(batch, advantages, whole, old)
    grads, metrics = run(batch, advantages, packed, old)
    for one_batch, by_budget in zip(expected_grads, grads, strict=True):
        assert torch.allclose(one_batch, by_budget, atol=1e-6, rtol=1e-5)
    assert any(float(g.abs().max()) > 1e-4 for g in grads)
    for key in METRICS:
        assert metrics[key] == pytest.approx(expected[key], abs=1e-5), key


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shared_prompts", [False, True])
@pytest.mark.parametrize("mu", [1, 2])
def test_token_budget_gives_the_one_batch_gradient(
    mode: LossAgg, shared_prompts: bool, mu: int
) -> None:
    batch, advantages = spread_batch(shared_prompts)
    cfg = GRPOConfig(loss_agg=mode, mu=mu, beta=0.1, max_len_norm=90)
    # 60 < the 93-token row (alone over the budget); the others pack into several passes
    assert_same_update(batch, advantages, cfg, budget=60)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shared_prompts", [False, True])
def test_token_budget_with_checkpointing_and_chunked_logits_gives_the_one_batch_gradient(
    mode: LossAgg, shared_prompts: bool
) -> None:
    """The three memory settings together (each pass planned by tokens, its layers recomputed
    in backward, its logits 16 positions at a time) against one plain pass of every row."""
    batch, advantages = spread_batch(shared_prompts)
    cfg = GRPOConfig(loss_agg=mode, mu=2, beta=0.1, max_len_norm=90)
    whole = cfg.model_copy(update={"micro_batch_size": len(batch)})
    packed = cfg.model_copy(
        update={
            "max_tokens_per_micro_batch": 60,
            "gradient_checkpointing": True,
            "logits_chunk_tokens": 16,
        }
    )
    expected_grads, expected = run(batch, advantages, whole)
    engine = RecordingEngine(model())
    head_positions: list[int] = []
    engine.model.lm_head.register_forward_hook(
        lambda _module, inputs, _out: head_positions.append(inputs[0].shape[-2])
    )
    metrics = grpo_update(
        engine, model(seed=1), batch, advantages, packed, None, torch.Generator().manual_seed(0)
    )
    assert is_checkpointing(engine.model)
    assert head_positions and max(head_positions) <= 16  # never the whole (B, T, V) logits
    for one_batch, by_budget in zip(expected_grads, engine.grads[0], strict=True):
        assert torch.allclose(one_batch, by_budget, atol=1e-6, rtol=1e-5)
    for key in METRICS:
        assert metrics[key] == pytest.approx(expected[key], abs=1e-5), key


@pytest.mark.parametrize("mode", MODES)
def test_token_budget_gives_the_one_batch_clipping_and_kl(mode: LossAgg) -> None:
    batch, advantages = spread_batch(shared_prompts=False)
    with torch.no_grad():
        current = sequence_logprobs(model(), batch)
    noise = torch.randn(current.shape, generator=torch.Generator().manual_seed(2))
    sampling = (current + 0.3 * noise) * batch.response_mask  # some ratios clip
    cfg = GRPOConfig(loss_agg=mode, beta=0.1, max_len_norm=90, use_sampling_logprobs_as_old=True)
    _, metrics = run(batch, advantages, cfg, sampling)
    assert metrics["clip_frac_low"] > 0 and metrics["clip_frac_high"] > 0
    assert_same_update(batch, advantages, cfg, budget=150, old=sampling)


def shapes(module: torch.nn.Module) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []

    def record(_: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        seen.append(tuple(kwargs["input_ids"].shape))

    module.register_forward_pre_hook(record, with_kwargs=True)
    return seen


def test_each_pass_pads_to_its_own_longest_row_within_the_budget() -> None:
    batch, advantages = spread_batch(shared_prompts=False)
    lengths = row_lengths(batch)
    engine = RecordingEngine(model())
    passes = shapes(engine.model)
    cfg = GRPOConfig(beta=0.0, max_tokens_per_micro_batch=100)
    metrics = grpo_update(engine, None, batch, advantages, cfg)
    plan = plan_micro_batches(lengths, 100)
    assert passes == [(len(rows), max(lengths[r] for r in rows)) for rows in plan]
    assert all(rows * width <= 100 for rows, width in passes)
    assert metrics["padding_share"] == pytest.approx(padding_share(lengths, plan))
    fixed = grpo_update(RecordingEngine(model()), None, batch, advantages, GRPOConfig(beta=0.0))
    width = batch.input_ids.shape[1]
    assert fixed["padding_share"] == pytest.approx(padding_share(lengths, [range(8)], width))
    assert metrics["padding_share"] < fixed["padding_share"] / 2


@pytest.mark.parametrize("mode", MODES)
def test_identical_rows_merge_across_packed_micro_batches(mode: LossAgg) -> None:
    batch, advantages = batch_with_copies()  # copies land in non-adjacent slots of a pass
    with torch.no_grad():
        sampling = sequence_logprobs(model(), batch)
    sampling[5] -= 0.5 * batch.response_mask[5]  # one copy was sampled apart
    cfg = GRPOConfig(loss_agg=mode, beta=0.1, max_len_norm=7)
    assert_same_update(batch, advantages, cfg, budget=16, old=sampling)
    _, metrics = run(
        batch, advantages, cfg.model_copy(update={"max_tokens_per_micro_batch": 16}), sampling
    )
    assert metrics["sampling_logprob_gap_max"] == pytest.approx(0.5, abs=1e-5)


def test_critic_token_budget_gives_the_one_batch_values_and_gradients(tmp_path: Path) -> None:
    batch, _ = spread_batch(shared_prompts=False)
    model().save_pretrained(tmp_path / "policy")
    scores = torch.randn(8, generator=torch.Generator().manual_seed(1))
    runs = []
    for micro in ({"micro_batch_size": 8}, {"max_tokens_per_micro_batch": 60}):
        cfg = GRPOConfig.model_validate(
            {"adv_estimator": "ppo", "beta": 0.0, "mu": 2, "mini_batches_per_epoch": 2, **micro}
        )
        critic = ValueModel.from_backbone(tmp_path / "policy")
        engine = RecordingEngine(critic)
        passes = shapes(critic.net)
        learner = CriticLearner(critic, engine, model(seed=3), model(seed=4), cfg)
        terms = learner.prepare(batch)
        metrics = learner.update(batch, terms, scores, seed=0)
        runs.append((terms, engine.grads, metrics))
        within = [rows * width <= 60 or rows == 1 for rows, width in passes]
        assert all(within) == ("max_tokens_per_micro_batch" in micro)
    (whole, whole_grads, expected), (packed, grads, metrics) = runs
    assert torch.allclose(whole.values, packed.values, atol=1e-6)
    assert torch.allclose(whole.log_ratio, packed.log_ratio, atol=1e-5)
    assert float(packed.log_ratio.abs().sum()) > 0
    assert len(grads) == len(whole_grads) == 4
    for step_whole, step_packed in zip(whole_grads, grads, strict=True):
        for one_batch, by_budget in zip(step_whole, step_packed, strict=True):
            assert torch.allclose(one_batch, by_budget, atol=1e-6, rtol=1e-5)
    for key in ("value_loss", "value_clipfrac", "value_mean", "returns_mean", "reward_kl"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-5), key
