"""The GRPO update: gradient accumulation, pi_old / reference handling, optimizer steps."""

from typing import Any

import pytest
import torch

from grpo_core.algo.config import GRPOConfig, LossAgg
from grpo_core.algo.losses import grpo_loss
from grpo_core.algo.update import grpo_update, rank_micro_batches
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import TorchEngine
from grpo_core.model.forward import sequence_logprobs, sequence_logprobs_and_entropy
from tests.models import tiny_llama
from tests.recording_engine import RecordingEngine

pytestmark = pytest.mark.usefixtures("one_torch_thread")


MODES: list[LossAgg] = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]


class RaisingModel(torch.nn.Module):
    def forward(self, **kwargs: Any) -> None:
        raise AssertionError("the reference model must not run when beta = 0")


def ragged_batch(rows: int = 8) -> tuple[PolicyBatch, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 12, (1 + i % 3,), generator=gen).tolist() for i in range(rows)]
    completions = [
        torch.randint(0, 12, ((5 * i) % 7,), generator=gen).tolist() for i in range(rows)
    ]
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="left")
    advantages = batch.expand_per_sequence(torch.randn(rows, generator=gen))
    return batch, advantages


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("mu", [1, 2])
def test_micro_batches_give_the_full_batch_gradient(mode: LossAgg, mu: int) -> None:
    batch, advantages = ragged_batch()
    assert 0 in batch.response_lengths.tolist()  # an empty response is in the batch
    grads = []
    for micro in (8, 2):
        engine = RecordingEngine(tiny_llama())
        cfg = GRPOConfig(loss_agg=mode, micro_batch_size=micro, mu=mu, max_len_norm=7)
        grpo_update(
            engine,
            tiny_llama(seed=1),
            batch,
            advantages,
            cfg,
            generator=torch.Generator().manual_seed(0),
        )
        grads.append(engine.grads)
    assert len(grads[0]) == mu
    for full, accumulated in zip(grads[0][0], grads[1][0], strict=True):
        assert torch.allclose(full, accumulated, atol=1e-6)
    assert any(float(g.abs().max()) > 1e-4 for g in grads[0][0])


def test_beta_zero_never_runs_the_reference_model() -> None:
    batch, advantages = ragged_batch()
    engine = TorchEngine(tiny_llama(), OptimizerSettings(lr=1e-3))
    metrics = grpo_update(engine, RaisingModel(), batch, advantages, GRPOConfig(beta=0.0))
    assert "kl" not in metrics  # no KL term applied: no KL figure (DAPO's table shows "-")


def test_beta_positive_needs_a_reference_model() -> None:
    batch, advantages = ragged_batch()
    with pytest.raises(ValueError, match="reference model"):
        grpo_update(
            TorchEngine(tiny_llama(), OptimizerSettings(lr=1e-3)),
            None,
            batch,
            advantages,
            GRPOConfig(),
        )


def count_forwards(model: torch.nn.Module) -> list[int]:
    calls = [0]
    model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


@pytest.mark.parametrize(("mu", "expected"), [(1, 2), (3, 2 * 3 + 2)])
def test_pi_old_forward_only_when_mu_above_one(mu: int, expected: int) -> None:
    batch, advantages = ragged_batch()
    model = tiny_llama()
    calls = count_forwards(model)
    cfg = GRPOConfig(beta=0.0, mu=mu, micro_batch_size=4)
    metrics = grpo_update(
        TorchEngine(model, OptimizerSettings(lr=1e-3)), None, batch, advantages, cfg
    )
    assert calls[0] == expected
    assert metrics["optimizer_steps"] == mu
    if mu == 1:
        assert metrics["ratio_max"] == pytest.approx(1.0) and metrics["approx_kl_old"] == 0.0


def test_sampling_logprobs_used_as_pi_old_only_when_configured() -> None:
    batch, advantages = ragged_batch()
    advantages = batch.response_mask.clone()  # all positive
    model = tiny_llama()
    with torch.no_grad():
        current = TorchEngine(model, OptimizerSettings(lr=1e-3)).forward_logprobs(batch, 1.0)[0]
    sampling = (current - 1.0) * batch.response_mask  # ratio e on every token
    ignored = grpo_update(
        TorchEngine(tiny_llama(), OptimizerSettings(lr=1e-3)),
        None,
        batch,
        advantages,
        GRPOConfig(beta=0.0),
        sampling,
    )
    assert ignored["ratio_max"] == pytest.approx(1.0)
    assert ignored["sampling_logprob_gap_max"] == pytest.approx(1.0, abs=1e-5)
    cfg = GRPOConfig(beta=0.0, use_sampling_logprobs_as_old=True)
    used = grpo_update(
        TorchEngine(tiny_llama(), OptimizerSettings(lr=1e-3)),
        None,
        batch,
        advantages,
        cfg,
        sampling,
    )
    assert used["clip_frac_high"] == pytest.approx(1.0)


def test_mini_batches_and_epochs_count_optimizer_steps() -> None:
    batch, advantages = ragged_batch()
    engine = RecordingEngine(tiny_llama())
    cfg = GRPOConfig(beta=0.0, mu=3, mini_batches_per_epoch=2, micro_batch_size=3)
    metrics = grpo_update(engine, None, batch, advantages, cfg)
    assert metrics["optimizer_steps"] == 6 and len(engine.grads) == 6
    with pytest.raises(ValueError, match="mini_batches_per_epoch"):
        grpo_update(
            engine, None, batch, advantages, cfg.model_copy(update={"mini_batches_per_epoch": 9})
        )


def test_misaligned_advantages_are_an_error() -> None:
    batch, _ = ragged_batch()
    with pytest.raises(ValueError, match="response_to_full"):
        grpo_update(
            RecordingEngine(tiny_llama()), None, batch, torch.zeros(8, 3), GRPOConfig(beta=0)
        )


def test_update_changes_the_policy_and_reports_metrics() -> None:
    batch, advantages = ragged_batch()
    model = tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    metrics = grpo_update(
        TorchEngine(model, OptimizerSettings(lr=1e-2)),
        tiny_llama(seed=1),
        batch,
        advantages,
        GRPOConfig(),
    )
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    for key in (
        "loss",
        "policy_loss",
        "kl",
        "clip_frac_low",
        "clip_frac_high",
        "approx_kl_old",
        "entropy",
        "zero_adv_seq_frac",
        "response_length",
        "grad_norm",
        "lr",
    ):
        assert key in metrics
    assert metrics["kl"] > 0 and metrics["grad_norm"] > 0


@pytest.mark.parametrize(("rows", "micro", "world"), [(8, 8, 1), (7, 2, 2), (3, 1, 2), (1, 4, 3)])
def test_ranks_split_a_mini_batch_into_equal_pass_counts(rows: int, micro: int, world: int) -> None:
    mini = torch.randperm(rows, generator=torch.Generator().manual_seed(0))
    shares = [rank_micro_batches(mini, micro, rank, world) for rank in range(world)]
    assert len({len(passes) for passes in shares}) == 1  # ZeRO passes are collective
    live = torch.cat([rows_ for passes in shares for rows_, is_live in passes if is_live])
    assert sorted(live.tolist()) == sorted(mini.tolist())  # every row once, on one rank
    assert all(len(rows_) <= micro for passes in shares for rows_, _ in passes)


def batch_with_copies() -> tuple[PolicyBatch, torch.Tensor]:
    """Rows as G samples give them: four distinct outputs repeated 4, 1, 2 and 2 times in
    mixed order; the last row has the tokens of output 0 under another advantage."""
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(1, 12, (2 + i % 2,), generator=gen).tolist() for i in range(4)]
    completions = [torch.randint(1, 12, (3 + i,), generator=gen).tolist() for i in range(4)]
    completions[1] = []  # an empty response
    order = [0, 1, 0, 2, 3, 0, 2, 3, 0]
    batch = build_policy_batch(
        [prompts[i] for i in order], [completions[i] for i in order], 0, "left"
    )
    values = torch.randn(4, generator=gen)[order]
    values[-1] = values[0] + 1.0
    return batch, batch.expand_per_sequence(values)


def count_rows(model: torch.nn.Module) -> list[int]:
    """Rows of each full or completion forward of `model` (a shared prompt's pass not
    counted)."""
    rows: list[int] = []

    def record(_: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if "logits_to_keep" not in kwargs:
            rows.append(int(kwargs["input_ids"].shape[0]))

    model.register_forward_pre_hook(record, with_kwargs=True)
    return rows


@pytest.mark.parametrize("mode", MODES)
def test_identical_rows_run_once_with_the_full_batch_gradient(mode: LossAgg) -> None:
    batch, advantages = batch_with_copies()
    cfg = GRPOConfig(loss_agg=mode, max_len_norm=7, beta=0.1)
    policy, reference = tiny_llama(), tiny_llama(seed=1)
    logp, entropy = sequence_logprobs_and_entropy(policy, batch)
    ref = sequence_logprobs(reference, batch)
    loss, expected = grpo_loss(
        logp, logp.detach(), ref, advantages, batch.response_mask, cfg, entropy=entropy
    )
    loss.backward()
    engine = RecordingEngine(tiny_llama())
    policy_rows, reference_rows = count_rows(engine.model), count_rows(reference)
    metrics = grpo_update(
        engine, reference, batch, advantages, cfg, generator=torch.Generator().manual_seed(0)
    )
    assert sum(policy_rows) == 5  # four outputs, one of them under two advantages
    assert sum(reference_rows) == 4  # the reference's log-probs need the tokens only
    for param, merged in zip(policy.parameters(), engine.grads[0], strict=True):
        assert param.grad is not None and torch.allclose(param.grad, merged, atol=1e-6)
    for key in ("loss", "kl", "entropy", "response_length", "zero_adv_seq_frac"):
        assert metrics[key] == pytest.approx(expected[key], abs=1e-6), key


def test_each_copy_keeps_its_own_sampling_logprob_gap() -> None:
    batch, advantages = batch_with_copies()
    model = tiny_llama()
    with torch.no_grad():
        current = sequence_logprobs(model, batch)
    sampling = current.clone()
    sampling[5] -= 0.5 * batch.response_mask[5]  # the third copy of output 0 was sampled apart
    metrics = grpo_update(
        TorchEngine(model, OptimizerSettings(lr=1e-3)),
        None,
        batch,
        advantages,
        GRPOConfig(beta=0.0),
        sampling,
    )
    assert metrics["sampling_logprob_gap_max"] == pytest.approx(0.5, abs=1e-5)


@pytest.mark.parametrize("micro", [8, 3, 1])
def test_per_output_metrics_are_exact_means_whatever_the_split(micro: int) -> None:
    batch, advantages = ragged_batch()
    advantages[2] = 0.0  # an output no advantage moves
    lengths = batch.response_lengths.tolist()
    nonempty = [n > 0 for n in lengths]
    assert nonempty[2] and not all(nonempty)
    metrics = grpo_update(
        TorchEngine(tiny_llama(), OptimizerSettings(lr=1e-3)),
        None,
        batch,
        advantages,
        GRPOConfig(beta=0.0, micro_batch_size=micro),
    )
    assert metrics["response_length"] == sum(lengths) / len(lengths)
    assert metrics["zero_adv_seq_frac"] == 1 / sum(nonempty)
