"""grpo.algo.max_tokens_per_micro_batch, and padding_free with it, end to end on `micro`: the
run completes, each GRPO step stores its padding share (0 packed), and the first update (same
sampled batch) reports the loss of fixed-row micro-batches."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.loop import execute_run
from storage.store import RunStore
from tests.flow_helpers import micro_config

RUN_ID = "budget"
SETTINGS = ("run.iterations=1",)


def grpo_step_metrics(store: Path) -> dict[int, dict[str, float]]:
    metrics = RunStore(store).read("metrics", run_id=RUN_ID).to_pylist()
    by_step: dict[int, dict[str, float]] = {}
    for m in metrics:
        if m["stage"] == "grpo" and m["step"] is not None:
            by_step.setdefault(m["step"], {})[m["name"]] = m["value"]
    return by_step


@pytest.mark.slow
def test_a_micro_run_with_a_token_budget_stores_its_padding_share(tmp_path: Path) -> None:
    fixed, packed = tmp_path / "fixed", tmp_path / "packed"
    execute_run(micro_config(fixed, RUN_ID, *SETTINGS))
    cfg = micro_config(packed, RUN_ID, *SETTINGS, "grpo.algo.max_tokens_per_micro_batch=64")
    assert cfg.grpo.algo.max_tokens_per_micro_batch == 64
    execute_run(cfg)
    want, got = grpo_step_metrics(fixed), grpo_step_metrics(packed)
    assert sorted(got) == sorted(want) and got
    for key in ("loss", "kl", "entropy", "response_length"):
        assert got[0][key] == pytest.approx(want[0][key], abs=1e-5), key
    for step, values in got.items():
        assert 0.0 <= values["padding_share"] < want[step]["padding_share"]


@pytest.mark.slow
def test_a_micro_run_with_padding_free_passes_computes_no_padding(tmp_path: Path) -> None:
    fixed, packed = tmp_path / "fixed", tmp_path / "packed"
    execute_run(micro_config(fixed, RUN_ID, *SETTINGS))
    settings = ("grpo.algo.max_tokens_per_micro_batch=64", "grpo.algo.padding_free=true")
    cfg = micro_config(packed, RUN_ID, *SETTINGS, *settings)
    assert cfg.grpo.algo.padding_free
    execute_run(cfg)
    want, got = grpo_step_metrics(fixed), grpo_step_metrics(packed)
    assert sorted(got) == sorted(want) and got
    for key in ("loss", "kl", "entropy", "response_length"):
        assert got[0][key] == pytest.approx(want[0][key], abs=1e-5), key
    assert all(values["padding_share"] == 0.0 for values in got.values())
