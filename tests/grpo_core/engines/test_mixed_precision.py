"""policy.dtype bf16-mixed (Lightning's name): float32 parameters and AdamW state, every
forward of the GRPO update (with pi_old and the reference) under torch.autocast(bfloat16).

Tolerances: bf16 keeps 8 mantissa bits (relative rounding 2^-9 ~ 2e-3 per matmul), and
autocast still runs log_softmax in float32; on the tiny Llama the log-probs (magnitude ~2.6)
move by ~3e-4 and the loss of four steps (mu = 2, clipped ratios) by ~2e-4, held to 5e-3 and
2e-3. A training run is held to float32's gain (measured within 0.2%) and direction (cosine
of the parameter deltas, measured 0.9999), as tests/grpo_core/engines/test_gpu.py holds
DeepSpeed's bf16 update to float32's direction.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

from grpo_core.algo.critic_update import CriticLearner, critic_optimizer_settings
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.engines.train import TorchEngine, with_policy_precision
from grpo_core.model.config import PolicyConfig
from grpo_core.model.critic import ValueModel
from grpo_core.model.forward import sequence_logprobs
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy, load_policy
from tests.grpo_core.algo.test_critic_update import BATCH, SCORES, algo
from tests.grpo_core.engines.test_deepspeed_engine import CFG, ragged_batch, seeded
from tests.grpo_core.engines.test_gpu import needs_deepspeed
from tests.models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _engine(model: nn.Module, dtype: str) -> TorchEngine:
    return TorchEngine(model, with_policy_precision(CFG.optimizer_settings(), dtype))


def _head_dtypes(model: nn.Module, seen: list[torch.dtype]) -> None:
    """Record the dtype of every logits tensor `model`'s output layer computes."""
    head = model.get_output_embeddings()
    head.register_forward_hook(lambda _m, _a, out: seen.append(out.dtype))


def test_bf16_mixed_holds_float32_parameters_at_every_load(tmp_path: Path) -> None:
    cfg = PolicyConfig(dtype="bf16-mixed")
    tokenizer = build_char_tokenizer(cfg.alphabet)
    model = create_tiny_policy(cfg, tokenizer)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    loaded, _ = load_policy(tmp_path, "bf16-mixed")
    assert {p.dtype for p in loaded.parameters()} == {torch.float32}


@pytest.mark.parametrize(
    ("dtype", "computed"), [("float32", torch.float32), ("bf16-mixed", torch.bfloat16)]
)
def test_every_forward_of_the_update_computes_in_the_policy_precision(
    dtype: str, computed: torch.dtype
) -> None:
    """The update's passes with gradients, pi_old (mu = 2) and the reference (beta > 0) all
    run their logits in bfloat16 under bf16-mixed; the parameters and AdamW's moments stay
    float32."""
    batch, advantages = ragged_batch(6)
    model, reference = tiny_llama(), tiny_llama(seed=1)
    policy_seen: list[torch.dtype] = []
    reference_seen: list[torch.dtype] = []
    _head_dtypes(model, policy_seen)
    _head_dtypes(reference, reference_seen)
    engine = _engine(model, dtype)
    grpo_update(engine, reference, batch, advantages, CFG, generator=seeded())
    passes_with_grad = CFG.mu * CFG.mini_batches_per_epoch
    assert len(policy_seen) > passes_with_grad  # pi_old ran too
    assert reference_seen
    assert set(policy_seen) == set(reference_seen) == {computed}
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    moments = [s["exp_avg"] for s in engine.optimizer.state.values()]
    assert moments and {m.dtype for m in moments} == {torch.float32}


def _logprobs(model: nn.Module, batch: PolicyBatch) -> torch.Tensor:
    with torch.no_grad():
        return sequence_logprobs(model, batch, 1.0) * batch.response_mask


def test_bf16_mixed_log_probs_and_loss_are_close_to_float32() -> None:
    batch, advantages = ragged_batch(6)
    results = {}
    for dtype in ("float32", "bf16-mixed"):
        engine = _engine(tiny_llama(), dtype)
        logp, _ = engine.forward_logprobs(batch, 1.0)
        metrics = grpo_update(
            engine, tiny_llama(seed=1), batch, advantages, CFG, generator=seeded()
        )
        results[dtype] = (logp.detach() * batch.response_mask, metrics["loss"])
    (logp32, loss32), (logp16, loss16) = results["float32"], results["bf16-mixed"]
    gap = float((logp16 - logp32).abs().max())
    assert 0 < gap < 5e-3  # bfloat16 did compute, and close to float32
    assert loss16 != loss32
    assert loss16 == pytest.approx(loss32, abs=2e-3)


def test_bf16_mixed_training_follows_float32s() -> None:
    """Four updates pushing every completion up (advantage +1): the completions' log-prob
    rises under both precisions by about as much, in about the same direction."""
    batch, _ = ragged_batch(6)
    up = batch.response_mask.clone()
    cfg = CFG.model_copy(update={"beta": 0.0, "lr": 3e-3})
    start = tiny_llama()
    before = {k: v.clone() for k, v in start.state_dict().items()}
    gains, deltas = {}, {}
    for dtype in ("float32", "bf16-mixed"):
        model = tiny_llama()
        engine = _engine(model, dtype)
        first = float(_logprobs(model, batch).sum())
        for _ in range(4):
            grpo_update(engine, None, batch, up, cfg, generator=seeded())
        gains[dtype] = float(_logprobs(model, batch).sum()) - first
        deltas[dtype] = torch.cat(
            [(v - before[k]).flatten() for k, v in model.state_dict().items()]
        )
    assert gains["float32"] > 1.0
    assert gains["bf16-mixed"] == pytest.approx(gains["float32"], rel=0.02)
    cosine = nn.functional.cosine_similarity(deltas["float32"], deltas["bf16-mixed"], dim=0)
    assert float(cosine) > 0.99


def test_ppo_critic_runs_its_forwards_in_the_policy_precision(tmp_path: Path) -> None:
    """PPO's critic engine takes policy.dtype's autocast too: its values in prepare and update
    and the policy / reference log-ratio passes compute in bfloat16, its parameters float32."""
    tiny_llama(seed=3).save_pretrained(tmp_path / "policy")
    critic = ValueModel.from_backbone(tmp_path / "policy")
    policy, reference = tiny_llama(seed=3), tiny_llama(seed=4)
    seen: dict[str, list[torch.dtype]] = {"critic": [], "policy": [], "reference": []}
    critic.net.score.register_forward_hook(lambda _m, _a, out: seen["critic"].append(out.dtype))
    _head_dtypes(policy, seen["policy"])
    _head_dtypes(reference, seen["reference"])
    cfg = algo()
    optim = with_policy_precision(critic_optimizer_settings(cfg), "bf16-mixed")
    learner = CriticLearner(critic, TorchEngine(critic, optim), policy, reference, cfg)
    learner.update(BATCH, learner.prepare(BATCH), SCORES, seed=0)
    assert all(seen.values()) and {d for ds in seen.values() for d in ds} == {torch.bfloat16}
    assert {p.dtype for p in critic.parameters()} == {torch.float32}


@needs_deepspeed
def test_deepspeed_engine_autocasts_as_the_torch_engine() -> None:
    """DeepSpeed (ZeRO-2, its own bf16 off: fp32 parameters) takes the same autocast: every
    logits tensor in bfloat16, and the torch engine's loss (measured equal; held to 1e-6, the
    order of the fp32 engines' LOSS_ATOL)."""
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    batch, advantages = ragged_batch(6)
    seen: list[torch.dtype] = []
    model = tiny_llama()
    _head_dtypes(model, seen)
    optim = with_policy_precision(CFG.optimizer_settings(), "bf16-mixed")
    engine = DeepSpeedEngine(model, optim, config=DeepSpeedConfig(zero_stage=2))
    metrics = grpo_update(engine, tiny_llama(seed=1), batch, advantages, CFG, generator=seeded())
    torch_engine = _engine(tiny_llama(), "bf16-mixed")
    want = grpo_update(torch_engine, tiny_llama(seed=1), batch, advantages, CFG, generator=seeded())
    assert seen and set(seen) == {torch.bfloat16}
    gap = abs(metrics["loss"] - want["loss"])
    print(f"DeepSpeed vs torch under bf16-mixed: |loss gap| {gap:.2e}")
    assert metrics["loss"] == pytest.approx(want["loss"], abs=1e-6)
