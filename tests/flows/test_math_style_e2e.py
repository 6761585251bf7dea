"""The math_style task end to end at micro scale: every stage commits, boxed answers flow
through the rows, and the PRM labels carry the task's exact step labels."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.loop import execute_run, planned_stages
from grpo_core.data.answer_formats import last_boxed
from grpo_core.data.reasoning_steps import split_steps
from grpo_core.data.tasks.base import Problem
from grpo_core.data.tasks.registry import make_task
from storage.sql import run_query
from storage.store import RunStore
from tests.flow_helpers import micro_config

pytestmark = pytest.mark.slow

# The preset's task on the micro policy, with budgets for its solutions (up to 90 characters).
MATH_STYLE = (
    "task.name=math_style",
    "task.math_style.max_number=2",
    *(
        f"{section}.max_new_tokens=96"
        for section in ("warm_start", "rollout", "labelling", "grpo", "evaluation")
    ),
)


def test_a_micro_run_on_the_math_style_task(tmp_path: Path) -> None:
    cfg = micro_config(tmp_path, "math", *MATH_STYLE)
    assert cfg.task.name == "math_style"
    results = execute_run(cfg)
    assert [(r.stage, r.iteration) for r in results] == planned_stages(cfg)
    store = RunStore(tmp_path)
    assert store.run_status("math")["status"] == "completed"

    task = make_task(cfg.task)
    rollouts = run_query(
        store,
        "SELECT r.completion, r.correct, r.extracted_answer, p.question, p.answer "
        "FROM rollouts r JOIN prompts p USING (run_id, iteration, problem_id) "
        "WHERE r.run_id = 'math'",
    ).to_pylist()
    assert len(rollouts) == cfg.run.iterations * cfg.rollout.prompts * cfg.rollout.group_size
    boxed = [r for r in rollouts if r["extracted_answer"] is not None]
    assert boxed  # the warm-started policy writes \boxed{} answers
    for r in rollouts:
        assert r["extracted_answer"] == last_boxed(r["completion"])
        problem = Problem("p", r["question"], r["answer"])
        assert r["correct"] == task.is_correct(problem, r["completion"])

    steps = run_query(
        store,
        "SELECT l.iteration, l.problem_id, l.sample_index, r.completion, p.question, p.answer, "
        "list(l.exact_label ORDER BY l.step_index) "
        "AS exact FROM prm_labels l JOIN rollouts r USING (run_id, iteration, problem_id, "
        "sample_index) JOIN prompts p USING (run_id, iteration, problem_id) "
        "WHERE l.run_id = 'math' GROUP BY ALL",
    ).to_pylist()
    assert steps
    for s in steps:  # every step has the task's exact label, as the task gives it
        problem = Problem("p", s["question"], s["answer"])
        expected = task.step_labels(problem, s["completion"]) or []
        assert s["exact"] == [int(x) for x in expected]
        assert len(s["exact"]) == len(split_steps(s["completion"]))
