"""NaN and infinity never reach the store: each source is injected and must stop the step
with an error naming the quantity, where it arose and the likely cause."""

from __future__ import annotations

import functools
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from flows.cli import main
from flows.config_files import stored_config_as_current
from flows.context import RunContext
from flows.names import GRPO_PROGRESS
from flows.stages.grpo import grpo_stage
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.rewards import StepRewards, check_rewards
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.numerics import NonFiniteError, require_finite, require_finite_metrics
from grpo_core.contracts.training import OptimizerSettings
from grpo_core.engines.train import TorchEngine
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import micro_config
from tests.grpo_core.algo.test_update import ragged_batch
from tests.models import tiny_llama

BAD = [math.nan, math.inf, -math.inf]


@pytest.mark.parametrize("bad", BAD)
def test_require_finite_names_quantity_place_cause_and_first_index(bad: float) -> None:
    values = torch.tensor([0.5, 1.0, bad, bad])
    with pytest.raises(NonFiniteError) as err:
        require_finite("the reward", values, where="step 3", cause="a weight")
    text = str(err.value)
    assert text.startswith(f"the reward is {bad} (2 non-finite value(s), first at index 2)")
    assert "at step 3; likely cause: a weight" in text
    with pytest.raises(NonFiniteError, match="metric 'kl'"):
        require_finite_metrics({"loss": 0.1, "kl": bad}, where="x", cause="y")
    with pytest.raises(NonFiniteError, match="index 1"):
        require_finite("q", [0.0, bad], where="x", cause="y")


@pytest.mark.parametrize(
    ("finite", "with_nan"),
    [
        (torch.tensor([[1.0, -2.0]]), torch.tensor([[1.0, math.nan]])),
        (3.0, math.nan),
        ([], [math.nan]),
    ],
    ids=["2-d tensor", "float", "list"],
)
def test_finite_values_pass_whatever_their_form(finite: Any, with_nan: Any) -> None:
    # The same form holding a NaN is refused: the check reads this form, it does not skip it.
    with pytest.raises(NonFiniteError):
        require_finite("q", with_nan, where="x", cause="y")
    assert require_finite("q", finite, where="x", cause="y") is None


def test_integers_and_huge_finite_metrics_pass() -> None:
    assert require_finite("q", torch.tensor([1, 2]), where="x", cause="y") is None
    assert require_finite_metrics({"a": 0.0, "b": 1e300}, where="x", cause="y") is None
    with pytest.raises(NonFiniteError, match="metric 'b'"):
        require_finite_metrics({"a": 0.0, "b": 1e300 * 1e300}, where="x", cause="y")


def _rewards(**bad: Any) -> StepRewards:
    fields: dict[str, Any] = {
        "total": torch.zeros(4),
        "parts": {VERIFIER: torch.zeros(4)},
        "rm": torch.zeros(4),
        "step_scores": [[0.1, 0.2]] * 4,
        "step_ends": [[1, 2]] * 4,
    }
    return StepRewards(**{**fields, **bad})


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("rm", torch.tensor([0.0, math.nan, 0.0, 0.0]), "the reward models' reward"),
        ("step_scores", [[0.1], [0.2, math.inf], [0.0], [0.0]], "PRM step rewards of output 1"),
        ("total", torch.tensor([0.0, 0.0, -math.inf, 0.0]), "the weighted reward"),
    ],
)
def test_every_reward_part_is_checked(field: str, value: Any, named: str) -> None:
    check_rewards(_rewards(), "GRPO iteration 0, step 0")  # finite: passes
    with pytest.raises(NonFiniteError, match=named) as err:
        check_rewards(_rewards(**{field: value}), "GRPO iteration 0, step 0")
    assert "reward weight (grpo.rewards) or a reward model's output" in str(err.value)


def test_a_nan_advantage_stops_the_update_before_any_weight_moves() -> None:
    batch, advantages = ragged_batch()
    advantages[1, -1] = math.nan
    model = tiny_llama()
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(NonFiniteError, match="GRPO loss is nan"):
        grpo_update(
            TorchEngine(model, OptimizerSettings(lr=1e-3)),
            None,
            batch,
            advantages,
            GRPOConfig(beta=0.0),
        )
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_an_infinite_reward_weight_is_refused_when_the_config_loads(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    code = main(
        [
            *("run", "--config", "micro", "--store", str(tmp_path / "s"), "--no-prefect"),
            *("--set", "grpo.rewards.verifier=inf"),
        ]
    )
    text = capsys.readouterr().err
    assert code == 2
    assert "grpo.rewards.verifier: Input should be a finite number" in text
    assert not (tmp_path / "s").exists()


# ---- injected into a real GRPO stage (the micro run's iteration 1, rerun on a copy) --------


def _float_values(root: Path) -> list[float]:
    out: list[float] = []
    for path in (root / "tables").rglob("*.parquet"):
        table = pq.read_table(path)
        for col in table.columns:
            if pa.types.is_floating(col.type):
                out += pc.drop_null(col).to_pylist()
    return out


def _rerun_grpo(
    micro_run: tuple[RunStore, str], tmp_path: Path, inject: Callable[[], None]
) -> NonFiniteError:
    store, run_id = micro_run
    copy = tmp_path / "store"
    shutil.copytree(store.root, copy)
    cfg = micro_config(copy, run_id)
    # removed at the stage's commit (store.progress_checkpoints): a rerun starts at step 0
    assert not checkpoint_path(copy, run_id, GRPO_PROGRESS, 1).exists()
    tables = sorted((copy / "tables").rglob("*"))
    inject()
    upgrade = functools.partial(stored_config_as_current, current=cfg)
    run = RunStore(copy).open_run(run_id, cfg.model_dump(mode="json"), upgrade_config=upgrade)
    ctx = RunContext(cfg, RunStore(copy), run)
    with run, pytest.raises(NonFiniteError) as err:
        grpo_stage(ctx, 1, lambda fraction, text: None)
    assert sorted((copy / "tables").rglob("*")) == tables  # nothing written
    assert not (checkpoint_path(copy, run_id, GRPO_PROGRESS, 1) / "config.json").exists()
    assert all(math.isfinite(v) for v in _float_values(copy))
    return err.value


@pytest.mark.slow
@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_an_orm_emitting_nan_or_inf_stops_grpo_naming_it(
    micro_run: tuple[RunStore, str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    bad: float,
) -> None:
    import reward_models.scoring as scoring

    real = scoring.score_outcome

    def broken(*args: Any, **kwargs: Any) -> torch.Tensor:
        scores = real(*args, **kwargs).clone()
        scores[2] = bad
        return scores

    err = _rerun_grpo(
        micro_run, tmp_path, lambda: monkeypatch.setattr(scoring, "score_outcome", broken)
    )
    assert str(err).startswith(f"the reward models' reward is {bad}")
    assert "at GRPO iteration 1, step 0" in str(err)


@pytest.mark.slow
def test_diverged_policy_weights_are_named_not_a_key_error(
    micro_run: tuple[RunStore, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = RunContext.policy

    def diverged(ctx: RunContext, k: int, weights: bool = True) -> Any:
        model, tokenizer = real(ctx, k, weights)
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(math.nan)
        return model, tokenizer

    err = _rerun_grpo(
        micro_run, tmp_path, lambda: monkeypatch.setattr(RunContext, "policy", diverged)
    )
    assert "the policy's sampling log-probs is nan" in str(err)
    assert "weights have diverged" in str(err)


@pytest.mark.slow
def test_a_non_finite_checkpoint_between_iterations_commits_nothing_and_the_repaired_run_is_clean(
    micro_run: tuple[RunStore, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """policy_1 (iteration 0's GRPO output) made non-finite on disk before iteration 1: the
    rollout stage that samples it stops naming the log-probs, before anything of iteration 1
    is stored; with the file repaired, the resumed run equals a clean one."""
    from safetensors.torch import load_file, save_file

    from flows.interrupts import FAULT_ENV
    from flows.loop import execute_run
    from flows.names import POLICY
    from tests.flow_helpers import snapshot

    clean_store, clean_id = micro_run
    cfg = micro_config(tmp_path, clean_id)
    monkeypatch.setenv(FAULT_ENV, "ValueError@rollout:1:1")  # stop after iteration 0
    with pytest.raises(ValueError, match="injected"):
        execute_run(cfg)
    monkeypatch.delenv(FAULT_ENV)
    store = RunStore(tmp_path)
    weights = checkpoint_path(tmp_path, clean_id, POLICY, 1) / "model.safetensors"
    good = weights.read_bytes()
    save_file({name: t.fill_(math.nan) for name, t in load_file(weights).items()}, weights)
    committed = store.committed_stages(clean_id)

    with pytest.raises(NonFiniteError) as err:
        execute_run(cfg)

    assert "the policy's sampling log-probs is nan" in str(err.value)
    assert "at the rollout sampling of policy_1" in str(err.value)
    assert store.committed_stages(clean_id) == committed  # nothing of iteration 1
    assert store.run_status(clean_id)["failure"]["stage"] == "rollout"
    weights.write_bytes(good)
    execute_run(cfg)
    assert snapshot(store, clean_id) == snapshot(clean_store, clean_id)
