"""The plain-torch engine (schedule, clipping, state) and the GRPO update settings."""

import math
from pathlib import Path

import pytest
import torch
from pydantic import ValidationError

from grpo_core.algo.config import GRPOConfig
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import OPTIMIZER_STATE_FILE, TorchEngine, lr_multiplier


def test_warmup_then_constant_or_cosine() -> None:
    assert [lr_multiplier(s, 4, "constant", None) for s in range(6)] == [0.25, 0.5, 0.75, 1, 1, 1]
    assert lr_multiplier(4, 4, "cosine", 14) == 1.0
    assert lr_multiplier(9, 4, "cosine", 14) == pytest.approx(0.5)
    assert lr_multiplier(14, 4, "cosine", 14) == pytest.approx(0.0)
    with pytest.raises(ValueError, match="total_steps"):
        TorchEngine(torch.nn.Linear(2, 2), OptimizerSettings(lr=1.0, lr_schedule="cosine"))


def test_engine_clips_steps_and_restores_state() -> None:
    model = torch.nn.Linear(3, 1, bias=False)
    engine = TorchEngine(model, OptimizerSettings(lr=0.1, max_grad_norm=0.5, warmup_steps=2))
    assert engine.current_lr() == pytest.approx(0.05)
    engine.backward((model(torch.ones(1, 3)) * 100).sum())
    norm = engine.step()
    assert norm == pytest.approx(100 * math.sqrt(3))
    assert engine.current_lr() == pytest.approx(0.1)
    assert all(p.grad is None for p in model.parameters())
    state = engine.state_dict()
    other = TorchEngine(
        torch.nn.Linear(3, 1, bias=False), OptimizerSettings(lr=0.1, warmup_steps=2)
    )
    other.load_state_dict(state)
    assert other.current_lr() == pytest.approx(0.1)


def test_engine_resumes_from_the_state_it_returns_and_saves_the_model_itself(
    tmp_path: Path,
) -> None:
    model = torch.nn.Linear(3, 1, bias=False)
    engine = TorchEngine(model, OptimizerSettings(lr=0.1, warmup_steps=2))
    engine.backward(model(torch.ones(1, 3)).sum())
    engine.step()
    state = engine.save_optimizer_state(tmp_path)
    assert state is not None and list(tmp_path.iterdir()) == []  # a dict, no files
    other = TorchEngine(
        torch.nn.Linear(3, 1, bias=False), OptimizerSettings(lr=0.1, warmup_steps=2)
    )
    other.load_optimizer_state(tmp_path, state)
    assert other.current_lr() == pytest.approx(0.1)
    with pytest.raises(ValueError, match="no optimizer state"):
        other.load_optimizer_state(tmp_path, None)
    assert engine.full_state_dict().keys() == model.state_dict().keys()
    assert torch.equal(engine.full_state_dict()["weight"], model.weight)
    assert engine.device == model.weight.device


def test_engine_resumes_from_the_file_ddp_ranks_wrote(tmp_path: Path) -> None:
    """A progress checkpoint written by DDP ranks keeps the state in OPTIMIZER_STATE_FILE
    (rank 0 writes it) and none in the training-state file: one process resumes from it."""
    model = torch.nn.Linear(3, 1, bias=False)
    engine = TorchEngine(model, OptimizerSettings(lr=0.1, warmup_steps=2))
    engine.backward(model(torch.ones(1, 3)).sum())
    engine.step()
    torch.save(engine.save_optimizer_state(tmp_path), tmp_path / OPTIMIZER_STATE_FILE)
    other = TorchEngine(
        torch.nn.Linear(3, 1, bias=False), OptimizerSettings(lr=0.1, warmup_steps=2)
    )
    other.load_optimizer_state(tmp_path, None)
    assert other.current_lr() == pytest.approx(0.1)  # the schedule after one step
    moments = other.optimizer.state_dict()["state"][0]
    assert torch.equal(moments["exp_avg"], engine.optimizer.state_dict()["state"][0]["exp_avg"])
    assert float(moments["step"]) == 1.0


def test_engine_skips_a_non_finite_step() -> None:
    model = torch.nn.Linear(2, 1, bias=False)
    before = model.weight.detach().clone()
    engine = TorchEngine(model, OptimizerSettings(lr=0.1))
    engine.backward((model(torch.ones(1, 2)) * float("inf")).sum())
    assert not math.isfinite(engine.step())
    assert torch.equal(model.weight, before)


@pytest.mark.parametrize(
    "bad", [{"beta": -1.0}, {"eps_low": 1.0}, {"mu": 0}, {"loss_agg": "sum"}, {"kl_estimtor": "k3"}]
)
def test_invalid_values_and_unknown_fields_are_rejected(bad: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        GRPOConfig(**bad)  # type: ignore[arg-type]


def test_every_field_describes_its_range() -> None:
    for name, field in GRPOConfig.model_fields.items():
        assert field.description and len(field.description) > 20, name
    assert GRPOConfig(adv_estimator="grpo_process").process_supervision
    for name, field in type(GRPOConfig().ppo).model_fields.items():
        assert field.description and len(field.description) > 20, name


def test_adamw_on_cpu_is_torchs_default_and_the_log_says_so_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The fused kernel is CUDA-only: a CPU engine keeps torch's default AdamW (the same
    steps as before fused AdamW existed), and the choice is logged once per process."""
    monkeypatch.setattr("grpo_core.engines.train._KERNEL_NOTED", set())
    caplog.set_level("INFO", logger="grpo_core.engines.train")
    engines = [TorchEngine(torch.nn.Linear(3, 1), OptimizerSettings(lr=0.1)) for _ in range(2)]
    assert all(e.optimizer.defaults["fused"] is None for e in engines)
    notes = [r.getMessage() for r in caplog.records if "AdamW" in r.getMessage()]
    assert notes == ["AdamW: torch's default implementation (fused AdamW is CUDA-only here)"]
