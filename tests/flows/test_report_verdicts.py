"""The run report says what a run did not measure: a guard that could not judge is listed as
not judged (with why), never counted as passed; a run that applies no KL shows "-" for it in
the table, the summary and the figure, where a run with a KL term shows its value."""

from __future__ import annotations

from pathlib import Path

from flows.guards import NOT_JUDGED_INFO
from flows.report import format_iteration_table, iteration_table, report_figures, summary_markdown
from storage.store import RunStore

WHY = "GRPO iteration 0 had 3 step(s) with a learned reward, fewer than ..."


def _store(tmp_path: Path, step_metrics: dict[str, float]) -> RunStore:
    """A run whose GRPO stage (iteration 0) took 2 steps with `step_metrics` each, between the
    evaluations of policy_0 and policy_1; its guards: equal_rewards passed, rm_labels of the
    ORM tripped (warn), over_optimisation not judged."""
    store = RunStore(tmp_path)
    accuracy = {"split": "test", "metric": "greedy_accuracy", "k": None, "value": 0.5, "n": 8}
    with store.open_run("r", {}) as run:
        with run.stage(0, "warm_start") as attempt:
            attempt.write("eval", [{"policy_iteration": 0, **accuracy, "stderr": 0.1}])
        with run.stage(0, "train_rm") as attempt:
            guard = {"stage": "train_rm", "step": None, "name": "guard_rm_labels_orm"}
            attempt.write("metrics", [guard | {"value": 1.0}])
        with run.stage(0, "grpo") as attempt:
            attempt.info[NOT_JUDGED_INFO] = {"guard_over_optimisation": WHY}
            rows = [
                {"stage": "grpo", "step": step, "name": name, "value": value}
                for step in (0, 1)
                for name, value in step_metrics.items()
            ]
            passed = {"stage": "grpo", "step": None, "name": "guard_equal_rewards", "value": 0.0}
            attempt.write("metrics", [*rows, passed])
        with run.stage(0, "evaluate") as attempt:
            attempt.write("eval", [{"policy_iteration": 1, **accuracy, "stderr": 0.1}])
    return store


def test_a_guard_that_could_not_judge_is_reported_as_not_judged(tmp_path: Path) -> None:
    store = _store(tmp_path, {"reward_mean": 0.5, "verifier_accuracy": 0.4})
    page = summary_markdown(store, "r")
    assert "Guards (docs/guards.md): 1 check(s) passed, 1 tripped, 1 not judged." in page
    assert "- tripped: `guard_rm_labels_orm` in train_rm of iteration 0" in page
    assert (
        f"- not judged (no verdict stored): `guard_over_optimisation` in grpo of iteration 0: {WHY}"
        in page
    )
    verdicts = store.read("metrics", run_id="r", where="name LIKE 'guard_%'").to_pylist()
    assert "guard_over_optimisation" not in {r["name"] for r in verdicts}  # no "passed" row


def test_a_run_without_a_kl_shows_a_dash_in_table_summary_and_figure(tmp_path: Path) -> None:
    # Issue 55, Why 4: PPO and DAPO showed KL 0 while DAPO applies none (and PPO a penalty).
    store = _store(tmp_path, {"reward_mean": 0.5, "verifier_accuracy": 0.4})
    (_, trained) = iteration_table(store, "r")
    assert trained["kl"] is None
    table = format_iteration_table(iteration_table(store, "r"))
    assert table.splitlines()[-1].split()[-1] == "-"
    row = [line for line in summary_markdown(store, "r").splitlines() if line.startswith("| 1 ")]
    assert row[0].endswith("| - |")
    right = report_figures(store, "r")["reward_kl"].axes[1]
    assert right.get_ylabel() == "KL to the reference: - (the run applies none)"
    assert right.get_lines() == [] and list(right.get_yticks()) == []


def test_a_run_with_a_kl_shows_it(tmp_path: Path) -> None:
    store = _store(tmp_path, {"reward_mean": 0.5, "verifier_accuracy": 0.4, "kl": 0.004})
    table = format_iteration_table(iteration_table(store, "r"))
    assert table.splitlines()[-1].split()[-1] == "0.004"
    right = report_figures(store, "r")["reward_kl"].axes[1]
    assert right.get_ylabel() == "KL to the reference (dashed)"
