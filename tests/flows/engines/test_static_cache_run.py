"""A micro run with `engines.hf.cache_implementation: static` samples every stage through the
static-cache loop and draws what the default dynamic loop draws: policy_0's rollouts and
evaluation equal the shared micro run's, and every stage commits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from flows.loop import execute_run, planned_stages
from grpo_core.engines.static_decode import StaticCacheRolloutEngine
from storage.store import RunStore
from tests.flow_helpers import micro_config

pytestmark = pytest.mark.slow


def test_a_micro_run_on_the_static_cache_samples_what_the_dynamic_loop_samples(
    tmp_path: Path, micro_run: tuple[RunStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    purposes: list[str] = []
    decode = StaticCacheRolloutEngine._generate_chunk

    def counted(engine: StaticCacheRolloutEngine, *args: Any) -> Any:
        assert engine.cannot_hold is None, engine.cannot_hold
        purposes.append(engine.progress_label)
        return decode(engine, *args)

    monkeypatch.setattr(StaticCacheRolloutEngine, "_generate_chunk", counted)
    cfg = micro_config(tmp_path, "static", "engines.hf.cache_implementation=static")
    results = execute_run(cfg)
    assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
    assert {"rollout", "label", "evaluate", "grpo"} <= set(purposes)
    store, reference = RunStore(tmp_path), micro_run

    def rollouts_0(s: RunStore, run_id: str) -> list[tuple[str, int, str, str]]:
        rows = s.read("rollouts", run_id=run_id, iterations=[0]).to_pylist()
        return sorted(
            (r["problem_id"], r["sample_index"], r["completion"], r["finish_reason"]) for r in rows
        )

    def policy_0_eval(s: RunStore, run_id: str) -> dict[tuple[str, str, int], float]:
        rows = s.read("eval", run_id=run_id, where="policy_iteration = 0").to_pylist()
        return {(r["split"], r["metric"], r["k"] or 0): r["value"] for r in rows}

    assert rollouts_0(store, "static") == rollouts_0(*reference)
    assert len(rollouts_0(store, "static")) == cfg.rollout.prompts * cfg.rollout.group_size
    ours, theirs = policy_0_eval(store, "static"), policy_0_eval(*reference)
    assert ours.keys() == theirs.keys()
    torch.testing.assert_close(
        list(ours.values()), list(theirs.values()), atol=1e-6, rtol=0, equal_nan=True
    )
