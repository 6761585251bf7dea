"""A finished run continued with more iterations (`itergrpo resume RUN --set
run.iterations=N`): the committed iterations are kept as they are and the new ones are
computed as a run planned for N iterations from the start would have (CPU, one thread:
deterministic, compared exactly)."""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from flows.config_files import load_config, stored_config_as_current, stored_config_for_rerun
from flows.config_readers import stages_reading
from storage.errors import ConfigMismatchError
from storage.store import RunStore
from tests.flow_helpers import cli, commit_a_stage, snapshot


def test_a_raised_iteration_count_is_no_difference_on_a_rerun_a_lowered_one_is(
    tmp_path: Path,
) -> None:
    started = load_config("micro", ["run.iterations=2"])
    store, stored = RunStore(tmp_path), started.model_dump(mode="json")
    commit_a_stage(store, "r", stored)  # a run with a committed stage

    def rerun_refused(*sets: str) -> list[str]:
        cfg = load_config("micro", list(sets))
        try:
            store.check_can_open(
                "r",
                cfg.model_dump(mode="json"),
                upgrade_config=functools.partial(stored_config_for_rerun, current=cfg),
                stage_readers=stages_reading,
            )
        except ConfigMismatchError as exc:
            return exc.keys
        return []

    assert rerun_refused("run.iterations=3") == []
    assert rerun_refused("run.iterations=1") == ["run.iterations"]
    assert rerun_refused("run.iterations=3", "run.seed=1") == ["run.seed"]
    # a fork still counts the iterations as read by every stage
    assert stored_config_as_current(stored, load_config("micro", ["run.iterations=3"])) == stored


def as_text(rows: list[dict[str, Any]]) -> Counter[str]:
    return Counter(json.dumps(r, sort_keys=True, default=str) for r in rows)


@pytest.mark.slow
def test_a_finished_run_continues_for_more_iterations(
    micro_run: tuple[RunStore, str], tmp_path: Path
) -> None:
    reference, run_id = micro_run  # micro plans 2 iterations; rollouts name the run id
    store = tmp_path / "store"
    first = cli(store, "run", "--config", "micro", "--run-id", run_id, "--set", "run.iterations=1")
    assert first.returncode == 0, first.stderr[-2000:]
    assert RunStore(store).run_status(run_id)["iterations_done"] == 1
    before = snapshot(RunStore(store), run_id)

    more = cli(store, "resume", run_id, "--set", "run.iterations=2")
    assert more.returncode == 0, more.stderr[-2000:]
    status = RunStore(store).run_status(run_id)
    assert (status["status"], status["iterations_done"]) == ("completed", 2)
    after = snapshot(RunStore(store), run_id)
    for table, rows in before.items():  # every stored row of iteration 0 as it was
        assert as_text(rows) <= as_text(after[table]), table
    assert {r["iteration"] for r in before["rollouts"]} == {0}
    assert {r["iteration"] for r in after["rollouts"]} == {0, 1}  # iteration 1's rows appear
    assert max(r["policy_iteration"] for r in after["eval"]) == 2  # policy_2 evaluated
    assert after == snapshot(reference, run_id)  # as if planned for 2 iterations
    kept = [yaml.safe_load(p.read_text()) for p in (store / "runs" / run_id).glob("config.*.yaml")]
    assert [c["run"]["iterations"] for c in kept] == [1]  # the old config, kept beside

    fewer = cli(store, "resume", run_id, "--set", "run.iterations=1")
    assert fewer.returncode == 2
    assert "differing keys: run.iterations" in fewer.stderr  # iteration 1 would outlive it
