"""GPU paths (`make gpu-check`): the GRPO update on CUDA, DeepSpeed on NCCL, bf16, a micro run.

Skipped only when no CUDA device is visible (CI has none). Tolerances: fp32 on the GPU runs
the same loss code as on the CPU with other reduction orders (cuBLAS, NCCL), ~1e-7 relative
per operation; after 4 optimizer steps at lr 1e-2 the measured gaps are far below 1e-5 while
the steps move parameters by ~3e-2, so 1e-5 still catches a wrong scale, a lost micro-batch
or a missing clip. bf16 rounds every activation to 8 mantissa bits: it is held to the fp32
update's direction (cosine of the parameter deltas) rather than to its values.
"""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

import pytest
import torch

from grpo_core.algo.update import grpo_update
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.engines.train import TorchEngine, with_policy_precision
from tests.grpo_core.engines.test_deepspeed_engine import CFG, ragged_batch, seeded
from tests.models import tiny_llama

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
needs_deepspeed = pytest.mark.skipif(
    find_spec("deepspeed") is None, reason="deepspeed is not installed: pip install -e '.[gpu]'"
)

GPU_ATOL = 1e-5
CUDA = torch.device("cuda")


def _update_on(
    device: torch.device, policy_dtype: str = "float32"
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    batch, advantages = ragged_batch(8)
    cfg = CFG.model_copy(update={"micro_batch_size": 3})
    model = tiny_llama().to(device)
    engine = TorchEngine(model, with_policy_precision(cfg.optimizer_settings(), policy_dtype))
    metrics = grpo_update(
        engine,
        tiny_llama(seed=1).to(device),
        batch.to(device),
        advantages.to(device),
        cfg,
        generator=seeded(),
    )
    return {n: p.detach().float().cpu() for n, p in model.named_parameters()}, metrics


def _gap(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max(float((a[n] - b[n].float().cpu()).abs().max()) for n in a)


def _delta(after: dict[str, torch.Tensor], before: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([(after[n] - before[n].float().cpu()).flatten() for n in after])


def test_torch_engine_update_on_cuda_matches_cpu() -> None:
    cpu_weights, cpu_metrics = _update_on(torch.device("cpu"))
    gpu_weights, gpu_metrics = _update_on(CUDA)
    gap = _gap(cpu_weights, gpu_weights)
    print(f"torch engine CUDA vs CPU fp32: max |param gap| {gap:.2e}")
    assert _gap(cpu_weights, tiny_llama().state_dict()) > 1e-2  # the update moved the weights
    assert gap < GPU_ATOL
    for key in ("loss", "kl", "ratio_max", "grad_norm"):
        assert gpu_metrics[key] == pytest.approx(cpu_metrics[key], abs=GPU_ATOL, rel=1e-5), key


def test_adamw_is_fused_on_cuda() -> None:
    engine = TorchEngine(tiny_llama().to(CUDA), CFG.optimizer_settings())
    assert engine.optimizer.defaults["fused"] is True


def test_bf16_mixed_update_on_cuda_follows_the_fp32_update() -> None:
    """policy.dtype bf16-mixed on CUDA: float32 weights stepped by the fused AdamW, forwards
    under CUDA autocast; held to the fp32 update's direction as the bf16 DeepSpeed test."""
    before = {n: p.detach().clone() for n, p in tiny_llama().named_parameters()}
    fp32, _ = _update_on(CUDA)
    mixed, metrics = _update_on(CUDA, "bf16-mixed")
    cosine = torch.nn.functional.cosine_similarity(
        _delta(fp32, before), _delta(mixed, before), dim=0
    )
    print(f"bf16-mixed vs fp32 on CUDA: cosine of the parameter deltas {float(cosine):.4f}")
    assert float(cosine) > 0.99
    assert metrics["optimizer_steps"] == 4


def _deepspeed_update(config: DeepSpeedConfig) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    batch, advantages = ragged_batch(8)
    cfg = CFG.model_copy(update={"micro_batch_size": 3})
    engine = DeepSpeedEngine(tiny_llama(), cfg.optimizer_settings(), config=config)
    assert engine.device.type == "cuda", engine.device
    ref = tiny_llama(seed=1).to(engine.device)
    if config.bf16:
        ref = ref.to(torch.bfloat16)
    metrics = grpo_update(
        engine,
        ref,
        batch.to(engine.device),
        advantages.to(engine.device),
        cfg,
        generator=seeded(),
    )
    return {n: v.float().cpu() for n, v in engine.full_state_dict().items()}, metrics


@needs_deepspeed
@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_zero_on_nccl_matches_torch_engine(stage: int) -> None:
    expected, torch_metrics = _update_on(CUDA)
    weights, ds_metrics = _deepspeed_update(DeepSpeedConfig(zero_stage=stage))
    gap = max(float((expected[n] - weights[n]).abs().max()) for n in expected)
    print(f"ZeRO-{stage} on NCCL vs torch engine (CUDA, fp32): max |param gap| {gap:.2e}")
    assert gap < GPU_ATOL
    assert ds_metrics["optimizer_steps"] == torch_metrics["optimizer_steps"] == 4
    assert ds_metrics["loss"] == pytest.approx(torch_metrics["loss"], abs=GPU_ATOL)


@needs_deepspeed
def test_bf16_grpo_update_follows_the_fp32_update() -> None:
    before = {n: p.detach().clone() for n, p in tiny_llama().named_parameters()}
    fp32, fp32_metrics = _update_on(CUDA)
    bf16, bf16_metrics = _deepspeed_update(DeepSpeedConfig(zero_stage=2, bf16=True))
    cosine = torch.nn.functional.cosine_similarity(
        _delta(fp32, before), _delta(bf16, before), dim=0
    )
    print(f"bf16 vs fp32 GRPO update: cosine of parameter deltas {float(cosine):.4f}")
    assert all(torch.isfinite(v).all() for v in bf16.values())
    assert float(cosine) > 0.95
    assert bf16_metrics["loss"] == pytest.approx(fp32_metrics["loss"], abs=5e-2)


@pytest.mark.slow
def test_micro_run_on_cuda_commits_every_stage(tmp_path: Path) -> None:
    from flows.loop import execute_run, planned_stages
    from storage.sql import run_query
    from storage.store import RunStore
    from tests.flow_helpers import micro_config

    cfg = micro_config(tmp_path, "cuda", "run.device=cuda")
    results = execute_run(cfg)
    assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
    store = RunStore(tmp_path)
    samples = run_query(
        store,
        "SELECT count(*) AS n, count(*) FILTER (WHERE isfinite(reward) AND isfinite(advantage)) "
        "AS finite FROM policy_samples WHERE run_id = 'cuda'",
    ).to_pylist()[0]
    size = cfg.run.iterations * cfg.grpo.steps * cfg.grpo.prompts_per_step * cfg.grpo.group_size
    assert samples == {"n": size, "finite": size}
