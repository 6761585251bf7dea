"""DeepSpeed engine: a GRPO update gives TorchEngine's loss and parameters (CPU, gloo).

Tolerance: both engines run the same fp32 loss code and the same torch AdamW; DeepSpeed
only reorders float sums (flattened ZeRO partitions, its gradient-norm reduction, and with
2 ranks a different split of each mini-batch and a gradient all-reduce). Each reordering
moves a value by ~1 ulp (6e-8 relative); measured gaps after 4 steps are <= 3e-7 while the
steps move parameters by ~3e-2 (lr 1e-2), so 2e-6 catches any real mismatch (a wrong scale,
a lost micro-batch, a missing clip) with room for BLAS differences between machines.
"""

import io
import json
import math
import sys
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch, build_policy_batch
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.engines.train import TorchEngine
from tests.models import tiny_llama
from tests.ports import free_port

needs_deepspeed = pytest.mark.skipif(
    find_spec("deepspeed") is None,
    reason="deepspeed is not installed: pip install -e '.[gpu]' (make venv installs it)",
)

PARAM_ATOL = 2e-6
LOSS_ATOL = 2e-6
CFG = GRPOConfig(
    mu=2,
    mini_batches_per_epoch=2,
    lr=1e-2,
    beta=0.04,
    weight_decay=0.01,
    max_grad_norm=0.5,  # below the measured norms (~1.5): clipping is exercised
    warmup_steps=2,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def ragged_batch(rows: int) -> tuple[PolicyBatch, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(1, 12, (1 + i % 3,), generator=gen).tolist() for i in range(rows)]
    completions = [
        torch.randint(0, 12, (1 + (5 * i) % 7,), generator=gen).tolist() for i in range(rows)
    ]
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="left")
    return batch, batch.expand_per_sequence(torch.randn(rows, generator=gen))


def seeded() -> torch.Generator:
    """The row-shuffling generator; UpdateJob's default seed 0 makes the launched ranks'."""
    return torch.Generator().manual_seed(0)


def torch_update(
    cfg: GRPOConfig, batch: PolicyBatch, advantages: torch.Tensor, tied: bool = False
) -> tuple[LlamaForCausalLM, dict[str, float]]:
    model = tiny_llama(tied=tied)
    engine = TorchEngine(model, cfg.optimizer_settings())
    metrics = grpo_update(
        engine, tiny_llama(seed=1, tied=tied), batch, advantages, cfg, generator=seeded()
    )
    return model, metrics


def max_param_gap(model: torch.nn.Module, weights: dict[str, torch.Tensor]) -> float:
    return max(
        float((p.detach() - weights[n].detach()).abs().max()) for n, p in model.named_parameters()
    )


def assert_same_update(
    torch_metrics: dict[str, float], ds_metrics: dict[str, float], gap: float, moved: float
) -> None:
    assert moved > 1e-2  # the update really changed the parameters
    assert gap < PARAM_ATOL, gap
    assert ds_metrics["optimizer_steps"] == torch_metrics["optimizer_steps"] == 4
    for key in ("loss", "policy_loss", "kl", "ratio_max", "ratio_min", "entropy"):
        assert ds_metrics[key] == pytest.approx(torch_metrics[key], abs=LOSS_ATOL), key
    assert ds_metrics["grad_norm"] == pytest.approx(torch_metrics["grad_norm"], rel=1e-5)
    assert ds_metrics["lr"] == torch_metrics["lr"] == CFG.lr


@needs_deepspeed
@pytest.mark.parametrize("stage", [0, 2])
def test_zero_in_process_matches_torch_engine(stage: int) -> None:
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    batch, advantages = ragged_batch(8)
    cfg = CFG.model_copy(update={"micro_batch_size": 3})
    expected, torch_metrics = torch_update(cfg, batch, advantages)
    engine = DeepSpeedEngine(
        tiny_llama(), cfg.optimizer_settings(), config=DeepSpeedConfig(zero_stage=stage)
    )
    ds_metrics = grpo_update(engine, tiny_llama(seed=1), batch, advantages, cfg, generator=seeded())
    gap = max_param_gap(expected, engine.full_state_dict())
    moved = max_param_gap(expected, tiny_llama().state_dict())
    print(
        f"ZeRO-{stage} in-process: max |param gap| {gap:.2e}, "
        f"|loss gap| {abs(ds_metrics['loss'] - torch_metrics['loss']):.2e}"
    )
    assert_same_update(torch_metrics, ds_metrics, gap, moved)


@needs_deepspeed
def test_state_dict_resumes_exactly_and_loads_weights_only() -> None:
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    batch, advantages = ragged_batch(6)
    cfg = GRPOConfig(lr=1e-2, beta=0.0, warmup_steps=3)
    ds = DeepSpeedConfig(zero_stage=2)
    first = DeepSpeedEngine(tiny_llama(), cfg.optimizer_settings(), config=ds)
    grpo_update(first, None, batch, advantages, cfg)
    buffer = io.BytesIO()
    torch.save(first.state_dict(), buffer)
    buffer.seek(0)
    state = torch.load(buffer, weights_only=True)
    resumed_model = tiny_llama(seed=5)
    resumed_model.load_state_dict(first.full_state_dict())
    resumed = DeepSpeedEngine(resumed_model, cfg.optimizer_settings(), config=ds)
    resumed.load_state_dict(state)
    assert resumed.current_lr() == pytest.approx(first.current_lr())
    grpo_update(first, None, batch, advantages, cfg, generator=seeded())
    grpo_update(resumed, None, batch, advantages, cfg, generator=seeded())
    first_weights = first.full_state_dict()
    assert max_param_gap(resumed.engine.module, first_weights) == 0.0


@needs_deepspeed
def test_optimizer_state_is_a_dict_in_fp32_zero2_and_a_checkpoint_under_zero3(
    tmp_path: Path,
) -> None:
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    batch, advantages = ragged_batch(4)
    cfg = GRPOConfig(lr=1e-2, beta=0.0, warmup_steps=3)
    for stage in (2, 3):
        ds = DeepSpeedConfig(zero_stage=stage)
        first = DeepSpeedEngine(tiny_llama(), cfg.optimizer_settings(), config=ds)
        grpo_update(first, None, batch, advantages, cfg)
        directory = tmp_path / f"zero{stage}"
        state = first.save_optimizer_state(directory)
        assert (state is None) == (stage == 3) == directory.is_dir()
        if state is not None:  # as a checkpoint holds it: a copy, not first's live tensors
            buffer = io.BytesIO()
            torch.save(state, buffer)
            buffer.seek(0)
            state = torch.load(buffer, weights_only=True)
        resumed_model = tiny_llama(seed=5)
        resumed_model.load_state_dict(first.full_state_dict())  # before the engine, as resumes do
        resumed = DeepSpeedEngine(resumed_model, cfg.optimizer_settings(), config=ds)
        resumed.load_optimizer_state(directory, state)
        assert resumed.current_lr() == pytest.approx(first.current_lr())
        grpo_update(first, None, batch, advantages, cfg, generator=seeded())
        grpo_update(resumed, None, batch, advantages, cfg, generator=seeded())
        expected, got = first.full_state_dict(), resumed.full_state_dict()  # whole under ZeRO-3
        assert all(torch.equal(got[name], value) for name, value in expected.items())


@needs_deepspeed
def test_bf16_weights_are_saved_whole_in_fp32_with_tied_weights_one_tensor() -> None:
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    engine = DeepSpeedEngine(
        tiny_llama(tied=True),
        OptimizerSettings(lr=1e-2),
        config=DeepSpeedConfig(zero_stage=2, bf16=True),
    )
    weights = engine.full_state_dict()
    assert next(engine.engine.module.parameters()).dtype == torch.bfloat16
    assert {v.dtype for v in weights.values()} == {torch.float32}
    assert weights["lm_head.weight"] is weights["model.embed_tokens.weight"]


@needs_deepspeed
def test_non_finite_gradient_skips_the_step() -> None:
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine

    for stage in (0, 2):
        model = tiny_llama()
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        engine = DeepSpeedEngine(
            model,
            OptimizerSettings(lr=0.1, warmup_steps=2),
            config=DeepSpeedConfig(zero_stage=stage),
        )
        batch, _ = ragged_batch(2)
        logp, _ = engine.forward_logprobs(batch, 1.0)
        engine.backward(logp.sum() * float("inf"))
        assert not math.isfinite(engine.step())
        assert max_param_gap(model, before) == 0.0
        assert engine.current_lr() == pytest.approx(0.05)  # the LR schedule did not advance


@needs_deepspeed
@pytest.mark.slow
def test_zero3_two_processes_through_the_launcher_match_torch_engine(tmp_path: Path) -> None:
    from grpo_core.engines.deepspeed_launch import UpdateJob, run_update_job, write_update_job

    # 6 rows in 2 mini-batches of 3 and one row per pass: rank 1 gets 1 row of each
    # mini-batch and pads a second, masked pass to match rank 0's two (ZeRO-3 is collective).
    batch, advantages = ragged_batch(6)
    cfg = CFG.model_copy(update={"micro_batch_size": 1})
    expected, torch_metrics = torch_update(cfg, batch, advantages, tied=True)
    tiny_llama(tied=True).save_pretrained(tmp_path / "policy_0")
    tiny_llama(seed=1, tied=True).save_pretrained(tmp_path / "reference")
    ds = DeepSpeedConfig(zero_stage=3, processes_per_node=2, master_port=free_port())
    job = UpdateJob(
        policy_dir=str(tmp_path / "policy_0"),
        reference_dir=str(tmp_path / "reference"),
        output_dir=str(tmp_path / "out"),
        grpo=cfg,
        deepspeed=ds,
    )
    lines: list[str] = []
    job_dir = write_update_job(tmp_path / "job", job, batch, advantages)
    ds_metrics = run_update_job(job_dir, ds, on_line=lines.append, env={"OMP_NUM_THREADS": "1"})
    assert any("exits successfully" in line for line in lines)  # the launcher's log streamed
    assert ds_metrics["data_parallel_size"] == 2
    updated = AutoModelForCausalLM.from_pretrained(tmp_path / "out" / "policy")
    gap = max_param_gap(expected, dict(updated.named_parameters()))
    moved = max_param_gap(expected, tiny_llama(tied=True).state_dict())
    print(
        f"ZeRO-3 2 processes: max |param gap| {gap:.2e}, "
        f"|loss gap| {abs(ds_metrics['loss'] - torch_metrics['loss']):.2e}"
    )
    assert_same_update(torch_metrics, ds_metrics, gap, moved)
    assert json.loads((tmp_path / "out" / "metrics.json").read_text()) == ds_metrics


def test_launcher_command_runs_this_package_on_every_rank(tmp_path: Path) -> None:
    from grpo_core.engines.deepspeed_launch import launcher_command

    cfg = DeepSpeedConfig(processes_per_node=4, master_port=29999, hostfile="/etc/hosts.ds")
    command = launcher_command(tmp_path, cfg, python="py")
    assert command[:3] == ["py", "-m", "deepspeed.launcher.runner"]
    assert command[3:9] == [
        "--hostfile",
        "/etc/hosts.ds",
        "--num_gpus",
        "4",
        "--master_port",
        "29999",
    ]
    assert command[-3:] == ["--module", "grpo_core.engines.deepspeed_launch", str(tmp_path)]


def test_missing_deepspeed_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from grpo_core.model.deepspeed_import import import_deepspeed

    monkeypatch.setitem(sys.modules, "deepspeed", None)
    with pytest.raises(ImportError, match=r"pip install -e '\.\[gpu\]'"):
        import_deepspeed()


def test_deepspeed_config_fields_describe_themselves() -> None:
    for name, field in DeepSpeedConfig.model_fields.items():
        assert field.description and len(field.description) > 20, name
    with pytest.raises(ValueError):
        DeepSpeedConfig(zero_stage=4)  # type: ignore[arg-type]
