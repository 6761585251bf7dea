"""PPO's critic learner: the terms it gives the estimator, its training, the KL controller it
drives, and a resume from its state that continues exactly."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.critic_update import CriticLearner, critic_optimizer_settings
from grpo_core.algo.ppo import adaptive_kl_coef, ppo_targets, sequence_kl, token_kl
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.engines.train import TorchEngine
from grpo_core.model.checkpointing import is_checkpointing
from grpo_core.model.critic import ValueModel
from grpo_core.model.forward import sequence_logprobs
from tests.models import tiny_llama
from tests.recording_engine import RecordingEngine, assert_same_gradients

BATCH = build_policy_batch([[1, 2], [1, 2], [3], [3]], [[4, 5, 6], [7], [8, 9], [5]], pad_id=0)
SCORES = torch.tensor([1.0, 0.0, 0.0, 1.0])


def algo(**ppo: object) -> GRPOConfig:
    return GRPOConfig.model_validate(
        {  # the ppo preset's update (flows/grpo_presets.py)
            "adv_estimator": "ppo",
            "beta": 0.0,
            "loss_agg": "token-mean",
            "micro_batch_size": 2,
            "mu": 2,
            "mini_batches_per_epoch": 2,
            "ppo": {"critic_lr": 1e-2, **ppo},
        }
    )


def on_engine(
    critic: ValueModel, cfg: GRPOConfig, reference: torch.nn.Module | None
) -> CriticLearner:
    engine = TorchEngine(critic, critic_optimizer_settings(cfg))
    return CriticLearner(critic, engine, tiny_llama(seed=3), reference, cfg)


def learner(tmp_path: Path, reference_seed: int | None = 4, **ppo: object) -> CriticLearner:
    path = tmp_path / "policy"
    if not path.is_dir():
        tiny_llama(seed=3).save_pretrained(path)
    reference = None if reference_seed is None else tiny_llama(seed=reference_seed)
    return on_engine(ValueModel.from_backbone(path), algo(**ppo), reference)


def test_prepare_gives_the_critics_values_and_the_policy_to_reference_log_ratio(
    tmp_path: Path,
) -> None:
    critic = learner(tmp_path)
    terms = critic.prepare(BATCH)
    with torch.no_grad():
        values = critic.critic(BATCH)
        old = sequence_logprobs(tiny_llama(seed=3), BATCH)
        ref = sequence_logprobs(tiny_llama(seed=4), BATCH)
    assert torch.allclose(terms.values, BATCH.full_to_response(values), atol=1e-6)
    assert torch.allclose(terms.log_ratio, BATCH.full_to_response(old - ref), atol=1e-5)
    assert terms.log_ratio.abs().sum() > 0
    assert (terms.kl_coef, terms.gamma, terms.lam, terms.whiten) == (0.04, 1.0, 0.95, True)
    # no reference (or kl_coef 0): no KL penalty, so no forward pass of it
    assert float(learner(tmp_path, None).prepare(BATCH).log_ratio.abs().sum()) == 0.0


def test_updates_on_one_batch_fit_the_returns(tmp_path: Path) -> None:
    critic = learner(tmp_path, vf_clip=100.0)
    terms = critic.prepare(BATCH)
    first = critic.update(BATCH, terms, SCORES, seed=0)
    for seed in range(1, 12):
        last = critic.update(BATCH, terms, SCORES, seed=seed)
    assert last["value_loss"] < 0.5 * first["value_loss"]
    mask = BATCH.full_to_response(BATCH.response_mask)
    returns = ppo_targets(terms, SCORES, mask).returns
    assert first["returns_mean"] == pytest.approx(float(returns.sum() / mask.sum()), abs=1e-6)
    assert first["kl_coef"] == 0.04 and critic.kl_coef == 0.04  # fixed: never moves


def test_a_step_stores_the_kl_its_reward_penalty_applied(tmp_path: Path) -> None:
    # PPO puts the KL in the reward: the step's `kl` is that penalty's per-token KL estimate
    # (today's code stored none here, and the loss's 0 stood in the table for it).
    critic = learner(tmp_path)
    terms = critic.prepare(BATCH)
    stats = critic.update(BATCH, terms, SCORES, seed=0)
    mask = BATCH.full_to_response(BATCH.response_mask)
    assert stats["kl"] == pytest.approx(float((terms.log_ratio * mask).sum() / mask.sum()))
    assert stats["kl"] == token_kl(terms.log_ratio, mask) and stats["kl"] != 0.0
    # No penalty applied (no reference, or kl_coef 0): no `kl` at all, not a 0.
    for none in (learner(tmp_path, None), learner(tmp_path, kl_coef=0.0)):
        assert "kl" not in none.update(BATCH, none.prepare(BATCH), SCORES, seed=0)
    # A KL term in the loss as well (beta > 0): the step's `kl` is the loss's, not this one.
    both = on_engine(ValueModel.from_backbone(tmp_path / "policy"), algo(), tiny_llama(seed=4))
    both.algo = both.algo.model_copy(update={"beta": 0.04})
    assert "kl" not in both.update(BATCH, both.prepare(BATCH), SCORES, seed=0)


def test_token_kl_by_hand() -> None:
    # log ratios 0.2, 0.4 | 0.3 (padding ignored): 0.9 / 3 tokens
    log_ratio = torch.tensor([[0.2, 0.4], [0.3, 5.0]])
    assert token_kl(log_ratio, torch.tensor([[1, 1], [1, 0]])) == pytest.approx(0.3)
    assert token_kl(torch.zeros(2, 0), torch.zeros(2, 0)) == 0.0


def test_the_adaptive_controller_updates_the_coefficient_after_each_step(tmp_path: Path) -> None:
    critic = learner(tmp_path, kl_ctl="adaptive", target_kl=1e-6, horizon=10)
    terms = critic.prepare(BATCH)
    stats = critic.update(BATCH, terms, SCORES, seed=0)
    kl = sequence_kl(terms.log_ratio, BATCH.full_to_response(BATCH.response_mask))
    assert stats["reward_kl"] == pytest.approx(kl)
    # |KL| far above the tiny target: the error clips at +0.2 (or -0.2 if KL is negative)
    assert critic.kl_coef == pytest.approx(adaptive_kl_coef(0.04, kl, 1e-6, 10, 4))
    assert critic.prepare(BATCH).kl_coef == critic.kl_coef


def test_a_learner_resumed_from_its_state_continues_exactly(tmp_path: Path) -> None:
    first = learner(tmp_path, kl_ctl="adaptive", target_kl=1e-6, horizon=10)
    first.update(BATCH, first.prepare(BATCH), SCORES, seed=0)
    saved = first.critic.save(tmp_path / "critic", first.weights())
    # as saved: first's next step must not touch it
    state = copy.deepcopy(first.save_state(saved / "engine"))
    cfg = algo(kl_ctl="adaptive", target_kl=1e-6, horizon=10)
    resumed = on_engine(ValueModel.load(saved), cfg, tiny_llama(seed=4))
    resumed.load_state(saved / "engine", state)
    want = first.update(BATCH, first.prepare(BATCH), SCORES, seed=1)
    got = resumed.update(BATCH, resumed.prepare(BATCH), SCORES, seed=1)
    assert got == want
    for a, b in zip(first.critic.parameters(), resumed.critic.parameters(), strict=True):
        assert torch.equal(a, b)


def test_gradient_checkpointing_keeps_the_critics_gradients(tmp_path: Path) -> None:
    tiny_llama(seed=3, layers=2).save_pretrained(tmp_path / "policy")
    grads = []
    for checkpointing in (False, True):
        critic = ValueModel.from_backbone(tmp_path / "policy")
        cfg = algo(vf_clip=100.0, critic_gradient_checkpointing=checkpointing)
        engine = RecordingEngine(critic)
        learner = CriticLearner(critic, engine, tiny_llama(seed=3), None, cfg)
        learner.update(BATCH, learner.prepare(BATCH), SCORES, seed=0)
        assert is_checkpointing(critic.net) == checkpointing
        grads.append(engine.grads)
    assert_same_gradients(grads[1], grads[0], atol=1e-6)
