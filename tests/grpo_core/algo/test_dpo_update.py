"""The DPO update and step (docs/algorithm.md section 12): the pairs a step marks reach the
update, its micro-batches give the one-pass gradient of the mean pair loss, it learns the
preference, and a step without a pair is skipped."""

import math

import pytest
import torch

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.dpo import preference_loss, sequence_logprob
from grpo_core.algo.rewards import StepRewards
from grpo_core.algo.step import NO_PAIRS, grpo_step, step_parts
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.contracts.rollout import RolloutBatch
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import TorchEngine
from grpo_core.model.forward import sequence_logprobs
from tests.grpo_core.algo.test_rewards import RecordingUpdate, ScriptedSampler, reward_by_text
from tests.models import tiny_llama
from tests.recording_engine import RecordingEngine, assert_same_gradients

pytestmark = pytest.mark.usefixtures("one_torch_thread")

DPO = {"adv_estimator": "dpo", "beta": 0.0}
# rows 0, 3, 7 chosen against 1, 4, 6; rows 2 and 5 are in no pair
SIDES = torch.tensor([1.0, -1.0, 0.0, 1.0, -1.0, 0.0, -1.0, 1.0])
CHOSEN, REJECTED = [0, 3, 7], [1, 4, 6]


def pair_batch() -> tuple[PolicyBatch, torch.Tensor]:
    """8 rows of ragged prompts and completions, their pair sides on the response tokens."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 12, (1 + i % 3,), generator=gen).tolist() for i in range(8)]
    completions = [torch.randint(0, 12, (2 + 3 * i % 5,), generator=gen).tolist() for i in range(8)]
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="left")
    return batch, batch.expand_per_sequence(SIDES)


def naive_loss(model: torch.nn.Module, reference: torch.nn.Module, cfg: GRPOConfig) -> torch.Tensor:
    """The mean pair loss over the batch in one pass, written out."""
    batch, _ = pair_batch()
    seq = sequence_logprob(sequence_logprobs(model, batch), batch.response_mask)
    with torch.no_grad():
        ref = sequence_logprob(sequence_logprobs(reference, batch), batch.response_mask)
    terms = preference_loss(seq[CHOSEN], seq[REJECTED], ref[CHOSEN], ref[REJECTED], cfg.dpo)
    return terms.losses.mean()


@pytest.mark.parametrize("micro", [2, 4, 64])  # one pair, two pairs, every pair per pass
def test_micro_batches_give_the_gradient_of_the_mean_pair_loss(micro: int) -> None:
    cfg = GRPOConfig(**DPO, micro_batch_size=micro, dpo={"beta": 0.5})
    batch, advantages = pair_batch()
    engine = RecordingEngine(tiny_llama())
    metrics = grpo_update(engine, tiny_llama(seed=1), batch, advantages, cfg)
    model = tiny_llama()
    loss = naive_loss(model, tiny_llama(seed=1), cfg)
    loss.backward()
    want = [[p.grad for p in model.parameters() if p.grad is not None]]
    assert_same_gradients(engine.grads, want, atol=1e-6)
    assert metrics["dpo_loss"] == pytest.approx(float(loss.detach()), abs=1e-6)
    assert (metrics["dpo_pairs"], metrics["optimizer_steps"]) == (3.0, 1.0)


def test_two_ranks_add_up_to_the_one_process_gradient() -> None:
    """3 pairs over 2 ranks at one pair per pass: rank 1 runs a padding pass with no loss,
    so both make the same number of passes and their gradients sum to one process's."""
    cfg = GRPOConfig(**DPO, micro_batch_size=2, dpo={"beta": 0.5})
    batch, advantages = pair_batch()
    one = RecordingEngine(tiny_llama())
    grpo_update(one, tiny_llama(seed=1), batch, advantages, cfg)
    summed: list[torch.Tensor] | None = None
    for rank in (0, 1):
        engine = RecordingEngine(tiny_llama())
        engine.data_parallel_size, engine.data_parallel_rank = 2, rank
        grpo_update(engine, tiny_llama(seed=1), batch, advantages, cfg)
        (grads,) = engine.grads
        summed = grads if summed is None else [a + b for a, b in zip(summed, grads, strict=True)]
    assert summed is not None
    assert_same_gradients([summed], one.grads, atol=1e-6)


def test_the_update_learns_the_preference_from_the_reference() -> None:
    cfg = GRPOConfig(**DPO, lr=3e-3, dpo={"beta": 0.5})
    batch, advantages = pair_batch()
    engine = TorchEngine(tiny_llama(), OptimizerSettings(lr=cfg.lr))
    first = grpo_update(engine, tiny_llama(), batch, advantages, cfg)
    # pi = pi_ref before the first step: margin 0, loss log 2
    assert first["dpo_loss"] == pytest.approx(math.log(2), abs=1e-5)
    assert first["dpo_reward_margin"] == pytest.approx(0.0, abs=1e-5)
    for _ in range(4):
        last = grpo_update(engine, tiny_llama(), batch, advantages, cfg)
    assert last["dpo_loss"] < first["dpo_loss"]
    assert last["dpo_reward_margin"] > 0
    assert last["dpo_chosen_reward"] > last["dpo_rejected_reward"]
    assert last["dpo_reward_accuracy"] == 1.0


def test_mini_batches_take_whole_pairs_at_most_one_step_each() -> None:
    batch, advantages = pair_batch()
    cfg = GRPOConfig(**DPO, mu=2, mini_batches_per_epoch=8)
    metrics = grpo_update(RecordingEngine(tiny_llama()), tiny_llama(seed=1), batch, advantages, cfg)
    assert metrics["optimizer_steps"] == 6.0  # 3 pairs: 3 steps per epoch, not 8


def test_the_dpo_update_needs_the_reference() -> None:
    batch, advantages = pair_batch()
    with pytest.raises(ValueError, match="needs the reference model"):
        grpo_update(RecordingEngine(tiny_llama()), None, batch, advantages, GRPOConfig(**DPO))


def test_the_step_hands_the_update_its_pairs() -> None:
    update = RecordingUpdate()
    parts = step_parts(
        ScriptedSampler(), update, GRPOConfig(**DPO), group_size=3, max_new_tokens=7, pad_token_id=0
    )
    out = grpo_step(parts, ["a", "b"], reward_by_text, seed=1, where="test step")
    ((batch, advantages, _, _),) = update.calls
    # groups [0, 1, 0] and [1, 0, 1] right by the verifier: one pair each, first ones first
    sides = torch.sign((advantages * batch.response_mask).sum(-1))
    assert sides.tolist() == [-1.0, 1.0, 0.0, 1.0, -1.0, 0.0]
    assert out.skipped is None


def test_a_step_without_a_pair_is_skipped() -> None:
    def all_wrong(batch: RolloutBatch) -> StepRewards:
        zeros = torch.zeros(len(batch.texts))
        return StepRewards(zeros, {"verifier": zeros.clone()}, None)

    update = RecordingUpdate()
    parts = step_parts(
        ScriptedSampler(), update, GRPOConfig(**DPO), group_size=3, max_new_tokens=7, pad_token_id=0
    )
    out = grpo_step(parts, ["a", "b"], all_wrong, seed=1, where="test step")
    assert out.skipped == NO_PAIRS and update.calls == []
    assert (out.stats["skipped_no_pairs"], out.stats["dpo_pairs"]) == (1.0, 0.0)
