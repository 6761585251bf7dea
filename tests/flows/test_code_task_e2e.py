"""The code task end to end on `micro`: every stage runs on programs, and each stored verdict
is what running the problem's tests against the stored output in the sandbox says."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.loop import execute_run
from grpo_core.data.answer_formats import ANSWER_FORMATS
from storage.store import RunStore
from tests.flow_helpers import micro_config

RUN_ID = "code"
LONGER = [
    f"{section}.max_new_tokens=48" for section in ("rollout", "grpo", "evaluation", "labelling")
]


@pytest.mark.slow
def test_a_micro_run_on_the_code_task_stores_the_sandbox_verdicts(tmp_path: Path) -> None:
    cfg = micro_config(
        tmp_path,
        RUN_ID,
        "task.name=code_functions",
        "task.code_functions.max_number=3",
        "task.code_functions.kinds=[linear,larger_of]",
        "run.iterations=1",
        "reward_models.use_prm=false",
        "warm_start.steps=300",
        *LONGER,
    )
    execute_run(cfg)
    store = RunStore(tmp_path)
    tests = {r["problem_id"]: r["answer"] for r in store.read("prompts", run_id=RUN_ID).to_pylist()}
    rollouts = store.read("rollouts", run_id=RUN_ID).to_pylist()
    assert rollouts and any(r["correct"] for r in rollouts)
    checker = ANSWER_FORMATS["python_tests"]
    for r in rollouts:
        assert r["correct"] == checker.is_correct(tests[r["problem_id"]], r["completion"])
    assert store.read("policy_samples", run_id=RUN_ID).num_rows > 0
    greedy = [
        e["value"]
        for e in store.read("eval", run_id=RUN_ID).to_pylist()
        if e["metric"] == "greedy_accuracy"
    ]
    assert greedy and all(0.0 <= v <= 1.0 for v in greedy)
