"""A task registered by a test (tests/toy_task.py, as docs/extending.md writes one) runs the
micro loop with no other file touched: every stage commits, its questions and verdicts flow
through the rows, and its settings section is stored with the run."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from flows.loop import execute_run, planned_stages
from grpo_core.data.tasks import Problem, make_task
from storage.sql import run_query
from storage.store import RunStore
from tests.flow_helpers import micro_config
from tests.toy_task import plus_one

__all__ = ["plus_one"]  # the fixture, used by name

pytestmark = pytest.mark.slow


def test_a_registered_task_runs_the_micro_loop(plus_one: str, tmp_path: Path) -> None:
    cfg = micro_config(
        tmp_path, "toy", f"task.name={plus_one}", f"task.{plus_one}.largest=20", "run.iterations=1"
    )
    results = execute_run(cfg)
    assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
    store = RunStore(tmp_path)
    assert store.run_status("toy")["status"] == "completed"
    assert store.run_config("toy")["task"][plus_one] == {"largest": 20}

    task = make_task(cfg.task)
    rollouts = run_query(
        store,
        "SELECT r.completion, r.correct, p.question, p.answer "
        "FROM rollouts r JOIN prompts p USING (run_id, iteration, problem_id) "
        "WHERE r.run_id = 'toy'",
    ).to_pylist()
    assert len(rollouts) == cfg.rollout.prompts * cfg.rollout.group_size
    for r in rollouts:
        n = re.fullmatch(r"What is (\d+)\+1\?", r["question"])
        assert n is not None and 1 <= int(n.group(1)) <= 20
        assert r["answer"] == str(int(n.group(1)) + 1)
        assert r["correct"] == task.is_correct(
            Problem("p", r["question"], r["answer"]), r["completion"]
        )
    evaluated = run_query(
        store, "SELECT DISTINCT policy_iteration FROM eval WHERE run_id = 'toy' ORDER BY 1"
    ).to_pylist()
    assert [row["policy_iteration"] for row in evaluated] == [0, 1]  # policy_0 and policy_1
