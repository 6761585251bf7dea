"""`itergrpo ablate --suite micro` end to end without Prefect, killed twice with SIGKILL and
resumed: the rerun finishes the ablation without redoing an arm-seed run it had committed,
and the `ablation` table, the verdict lines and the report come out as from one clean run."""

from __future__ import annotations

import signal
from pathlib import Path

import pyarrow.dataset as ds
import pytest

from flows.ablate.cost import PEAK_MIB, S_PER_STEP, STATE_MIB
from flows.cli import main
from storage.store import RunStore
from tests.flow_helpers import cli

pytestmark = pytest.mark.slow
ABLATION = "ablate-micro"
RUNS = [f"{ABLATION}-{arm}-s{seed}" for arm in ("grpo_os", "online_rft") for seed in (0, 1)]


def commits(store: Path, run_id: str) -> list[tuple[str, int, int, str]]:
    """(stage, iteration, attempt, committed_at) of every committed stage of `run_id`."""
    stages = RunStore(store).committed_stages(run_id)
    return [(s["stage"], s["iteration"], s["attempt"], str(s["committed_at"])) for s in stages]


def complete(store: Path, run_id: str) -> bool:
    return RunStore(store).run_status(run_id)["status"] == "completed"


def test_micro_ablation_survives_kills_and_reports(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    # 1. killed inside the GRPO stage of the first arm-seed run's second iteration
    first = cli(store, "ablate", "--suite", "micro", fault="SIGKILL@grpo:1:2")
    assert first.returncode == -signal.SIGKILL, first.stderr[-2000:]
    assert [s[0] for s in commits(store, ABLATION)] == ["warm_start"]  # the shared policy_0
    assert not complete(store, RUNS[0])

    # 2. the same command resumes that run mid-stage, finishes the second, and is killed as
    # the third arm-seed run starts
    second = cli(store, "ablate", "--suite", "micro", fault="SIGKILL@arm_run:3:1")
    assert second.returncode == -signal.SIGKILL, second.stderr[-2000:]
    assert "shared policy_0 already committed" in second.stderr
    assert "GRPO: resuming at step 1" in second.stderr
    assert [complete(store, r) for r in RUNS[:2]] == [True, True]
    assert not (RunStore(store).run_dir(RUNS[2])).exists()
    before = {r: commits(store, r) for r in RUNS[:2]}

    # 3. `itergrpo resume ABLATION_ID` runs what is left, and only that
    final = cli(store, "resume", ABLATION)
    assert final.returncode == 0, final.stderr[-2000:]
    for position, run_id in enumerate(RUNS[:2], start=1):
        assert f"[{position}/4] arm grpo_os, seed {position - 1}: {run_id} committed, skipped" in (
            final.stderr
        )
        assert commits(store, run_id) == before[run_id]  # not one stage redone
    assert "[3/4] arm online_rft, seed 0: run" in final.stderr
    # the arms differ only in what the iterations read: the evaluation of policy_0 at a seed
    # is computed once (flows/fork.py)
    for seed in (0, 1):
        assert (
            f"arm online_rft, seed {seed}: forked warm_start from {ABLATION}-grpo_os-s{seed}"
        ) in final.stderr
    assert all(complete(store, r) for r in RUNS)

    # the table and the verdicts
    out = final.stdout
    header = next(line for line in out.splitlines() if line.startswith("arm "))
    assert header.split() == ["arm", "policy", "seeds", "greedy", "acc", "Maj@8", "Pass@8"]
    for arm in ("policy_0", "grpo_os", "online_rft"):
        assert any(line.startswith(arm) for line in out.splitlines())
    assert "grpo_os > online_rft: difference" in out
    assert "paired by problem and seed: " in out  # the second interval, beside the first
    assert "Fig. 6: RM retrained every iteration >= RM trained once" in out
    assert "not run (the suite lacks its arms)" in out
    verdicts = [line for line in out.splitlines() if line.startswith("Fig. ")]
    assert len(verdicts) == 3
    assert all(
        line.endswith(("holds", "does not hold", "inconclusive", "lacks its arms)"))
        for line in verdicts
    )
    report = store / "reports" / ABLATION
    assert {p.name for p in report.iterdir()} == {
        "fig5_arms.png",
        "fig6_rm_retraining.png",
        "fig7_maj_pass.png",
        "summary.md",
    }

    # the `ablation` table through SQL: 2 arms x 2 seeds, committed once
    query = "SELECT arm, count(DISTINCT seed) AS seeds FROM ablation GROUP BY 1 ORDER BY 1"
    assert main(["sql", query, "--store", str(store), "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ['"arm","seeds"', '"grpo_os",2', '"online_rft",2']
    rows = RunStore(store).read("ablation", run_id=ABLATION).to_pylist()
    assert {r["arm_run_id"] for r in rows} == set(RUNS)
    # beside the accuracy, each trained policy's GRPO stage cost, at every arm and seed
    assert "cost per arm" in out
    costs = {(r["arm_run_id"], r["policy_iteration"], r["metric"]) for r in rows}
    for run_id in RUNS:
        for policy in (1, 2):
            assert {(run_id, policy, m) for m in (S_PER_STEP, PEAK_MIB, STATE_MIB)} <= costs
        assert (run_id, 0, S_PER_STEP) not in costs  # policy_0 trained nothing in the arm
    assert [s[0] for s in commits(store, ABLATION)] == ["warm_start", "ablation"]
    # every arm evaluates the same policy_0 on the same problems at a given seed
    policy_0 = {
        (r["arm"], r["seed"], r["metric"], r["k"]): r["value"]
        for r in rows
        if r["policy_iteration"] == 0
    }
    for (arm, seed, metric, k), value in policy_0.items():
        assert policy_0[("grpo_os", seed, metric, k)] == value, (arm, seed, metric, k)
    # the per-problem values behind them: 8 problems per evaluation, their mean the table's
    values = {(r["arm_run_id"], r["policy_iteration"], r["metric"], r["k"]): r for r in rows}
    per_problem = RunStore(store).read("ablation_problems", run_id=ABLATION).to_pylist()
    grouped: dict[tuple[str, int, str, int], list[float]] = {}
    for r in per_problem:
        key = (r["arm_run_id"], r["policy_iteration"], r["metric"], r["k"])
        grouped.setdefault(key, []).append(r["value"])
    assert {run_id for run_id, *_ in grouped} == set(RUNS)
    assert {(run_id, 2, "greedy_accuracy", 1) for run_id in RUNS} <= set(grouped)
    for key, found in grouped.items():
        assert len(found) == 8
        assert sum(found) / 8 == pytest.approx(values[key]["value"]), key

    # 4. more seeds for the finished ablation: only the new seed runs, and the rewritten
    # table (holding all three) supersedes the committed one; fewer seeds are refused
    old_commits = {r: commits(store, r) for r in RUNS}
    grown = cli(store, "ablate", "--suite", "micro", "--seeds", "3")
    assert grown.returncode == 0, grown.stderr[-2000:]
    assert "its table holds 2 seeds; adding seed 2, then rewriting it" in grown.stderr
    assert all(commits(store, r) == old_commits[r] for r in RUNS)
    assert all(complete(store, f"{ABLATION}-{arm}-s2") for arm in ("grpo_os", "online_rft"))
    assert main(["sql", query, "--store", str(store), "--format", "csv"]) == 0
    assert capsys.readouterr().out.split() == ['"arm","seeds"', '"grpo_os",3', '"online_rft",3']
    grown_rows = RunStore(store).read("ablation", run_id=ABLATION).to_pylist()
    old_seeds = sorted((r for r in grown_rows if r["seed"] < 2), key=repr)
    assert old_seeds == sorted(rows, key=repr)  # the old seeds' rows, unchanged
    # a raw reader of the Parquet tree sees the new table only (the superseded one moved out)
    raw = ds.dataset(store / "tables" / "ablation", format="parquet", partitioning="hive")
    assert raw.to_table(filter=ds.field("run_id") == ABLATION).num_rows == len(grown_rows)
    assert "(n=3)" in grown.stdout
    assert [s[:3] for s in commits(store, ABLATION)] == [
        ("warm_start", 0, 1),
        ("ablation", 0, 2),
    ]
    # (in this process: a refusal before any work, the message as the console prints it)
    fewer = ["ablate", "--suite", "micro", "--seeds", "2", "--store", str(store), "--no-prefect"]
    assert main(fewer) != 0
    refused = capsys.readouterr().err
    assert "finished with 3 seeds, more than the 2 asked for: pass --seeds 3" in refused
