"""The GRPO update with the memory settings on: gradient checkpointing and log-probs through
the output layer in token chunks give the loss and every gradient of the plain update (fp32,
within 1e-5), for each loss aggregation, on rows with distinct prompts (one padded pass) and
on groups sharing a prompt (the KV-cache path)."""

import pytest
import torch

from grpo_core.algo.config import GRPOConfig, LossAgg
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.model.checkpointing import is_checkpointing
from tests.models import tiny_llama
from tests.recording_engine import RecordingEngine, assert_same_gradients

pytestmark = pytest.mark.usefixtures("one_torch_thread")

MODES: list[LossAgg] = ["seq-mean-token-mean", "token-mean", "seq-mean-token-sum-norm"]
ATOL = 1e-5


def rows(shared_prompts: bool) -> tuple[PolicyBatch, torch.Tensor]:
    """8 rows of ragged completions (one empty); with shared_prompts, 2 groups of 4."""
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 12, (1 + i % 3,), generator=gen).tolist() for i in range(8)]
    if shared_prompts:
        prompts = [prompts[i // 4] for i in range(8)]
    completions = [torch.randint(0, 12, ((5 * i) % 7,), generator=gen).tolist() for i in range(8)]
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="left")
    return batch, batch.expand_per_sequence(torch.randn(8, generator=gen))


def update(
    batch: PolicyBatch, advantages: torch.Tensor, cfg: GRPOConfig
) -> tuple[dict[str, float], list[list[torch.Tensor]], torch.nn.Module]:
    engine = RecordingEngine(tiny_llama(layers=2, tied=True))
    metrics = grpo_update(
        engine,
        tiny_llama(seed=1, layers=2, tied=True),
        batch,
        advantages,
        cfg,
        generator=torch.Generator().manual_seed(0),
    )
    return metrics, engine.grads, engine.model


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("shared_prompts", [False, True])
@pytest.mark.parametrize(
    "memory",
    [
        {"gradient_checkpointing": True},
        {"logits_chunk_tokens": 5},
        {"gradient_checkpointing": True, "logits_chunk_tokens": 3},
    ],
)
def test_memory_settings_keep_the_loss_and_gradients(
    mode: LossAgg, shared_prompts: bool, memory: dict[str, object]
) -> None:
    batch, advantages = rows(shared_prompts)
    plain = GRPOConfig(loss_agg=mode, micro_batch_size=4, mu=2, beta=0.04, max_len_norm=7)
    base_metrics, base_grads, _ = update(batch, advantages, plain)
    metrics, grads, model = update(batch, advantages, plain.model_copy(update=memory))
    assert is_checkpointing(model) == bool(memory.get("gradient_checkpointing"))
    assert metrics["loss"] == pytest.approx(base_metrics["loss"], abs=ATOL)
    assert metrics["entropy"] == pytest.approx(base_metrics["entropy"], abs=ATOL)
    assert_same_gradients(grads, base_grads, ATOL)
