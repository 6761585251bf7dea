"""A micro run sampled by `engines.rollout: hf_generate` (transformers' generate drives the
decoding) draws what the default `hf` engine draws: policy_0's rollouts and evaluation equal
the shared micro run's, and every stage commits."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.loop import execute_run, planned_stages
from storage.store import RunStore
from tests.flow_helpers import micro_config

pytestmark = pytest.mark.slow


def test_a_micro_run_on_generate_samples_what_the_lean_loop_samples(
    tmp_path: Path, micro_run: tuple[RunStore, str]
) -> None:
    cfg = micro_config(tmp_path, "gen", "engines.rollout=hf_generate")
    results = execute_run(cfg)
    assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
    store, reference = RunStore(tmp_path), micro_run

    def rollouts_0(s: RunStore, run_id: str) -> list[tuple[str, int, str, str]]:
        rows = s.read("rollouts", run_id=run_id, iterations=[0]).to_pylist()
        return sorted(
            (r["problem_id"], r["sample_index"], r["completion"], r["finish_reason"]) for r in rows
        )

    def policy_0_eval(s: RunStore, run_id: str) -> dict[tuple[str, str, int], float]:
        rows = s.read("eval", run_id=run_id, where="policy_iteration = 0").to_pylist()
        return {
            (r["split"], r["metric"], r["k"] or 0): r["value"]
            for r in rows
            if "auroc" not in r["metric"]  # the RMs' rows: same samples, checked above
        }

    assert rollouts_0(store, "gen") == rollouts_0(*reference)
    assert len(rollouts_0(store, "gen")) == cfg.rollout.prompts * cfg.rollout.group_size
    assert policy_0_eval(store, "gen") == policy_0_eval(*reference)
