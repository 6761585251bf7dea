"""Shared pieces of the flow tests: the micro config in a temp store, and store snapshots."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from flows.config import ItergrpoConfig
from flows.config_files import load_config
from flows.interrupts import FAULT_ENV
from storage.schemas import TABLE_KEYS
from storage.store import RunStore

DATA_TABLES = ("prompts", "rollouts", "orm_labels", "prm_labels", "rm_train", "policy_samples")


class EngineStop(BaseException):
    """Stands for an engine's termination signal (Prefect's TerminationSignal on a UI cancel
    or a SIGTERM) in tests of the status a stop records."""


def micro_config(store: Path, run_id: str, *overrides: str) -> ItergrpoConfig:
    return load_config("micro", [f"store.root={store}", f"run.run_id={run_id}", *overrides])


def snapshot(store: RunStore, run_id: str) -> dict[str, Any]:
    """Everything a resumed run must reproduce: data rows (without run_id) and eval values."""
    out: dict[str, Any] = {}
    for table in DATA_TABLES:
        rows = store.read(table, run_id=run_id).drop(["run_id"]).to_pylist()
        keys = ("iteration", *TABLE_KEYS[table])
        out[table] = sorted(rows, key=lambda r: tuple(str(r[k]) for k in keys))
    # NaN (e.g. AUROC with one class only) compares unequal to itself: compare it as text.
    evals = [
        {k: "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in row.items()}
        for row in store.read("eval", run_id=run_id).drop(["run_id"]).to_pylist()
    ]
    out["eval"] = sorted(
        evals, key=lambda r: (r["policy_iteration"], r["split"], r["metric"], r["k"] or 0)
    )
    problems = store.read("eval_problems", run_id=run_id).drop(["run_id"]).to_pylist()
    keys = ("policy_iteration", "split", "metric", "k", "problem_index")
    out["eval_problems"] = sorted(problems, key=lambda r: tuple(r[k] for k in keys))
    return out


REPO = Path(__file__).resolve().parent.parent
# torch.distributed variables an in-process DeepSpeed run of the test process may have left
# set: a child seeing them would try to listen on this process's port.
_DIST_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


# `itergrpo`, its warm starts shared with the test run's (tests/warm_start_cache.py)
CLI_MODULE = "tests.cli_shared_warm_starts"


def cli(store: Path, *args: str, fault: str | None = None) -> subprocess.CompletedProcess[str]:
    """`itergrpo ARGS --store STORE --no-prefect` in a child process, one torch thread, with
    the ITERGRPO_FAULT signal `fault` (or none)."""
    env = {k: v for k, v in os.environ.items() if k not in (*_DIST_VARS, FAULT_ENV)}
    env["OMP_NUM_THREADS"] = "1"
    if fault:
        env[FAULT_ENV] = fault
    return subprocess.run(
        [sys.executable, "-m", CLI_MODULE, *args, "--store", str(store), "--no-prefect"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def commit_a_stage(store: RunStore, run_id: str, config: dict[str, Any]) -> None:
    """A run `run_id` with `config` and one committed stage (a run that has started)."""
    with store.open_run(run_id, config) as run, run.stage(0, "s") as attempt:
        attempt.write("metrics", [{"stage": "s", "name": "x", "value": 1.0}])


def set_args(sets: list[str]) -> list[str]:
    """`--set KEY=VALUE` arguments of a CLI call, one pair per override."""
    return [arg for item in sets for arg in ("--set", item)]


def killed_micro_run(
    store: Path, run_id: str, sets: list[str], fault: str
) -> subprocess.CompletedProcess[str]:
    """`itergrpo run --config micro` with `sets`, killed by the SIGKILL fault `fault` in a
    child process (asserted); its result, for the test to check the console."""
    args = ["run", "--config", "micro", "--run-id", run_id, *set_args(sets)]
    killed = cli(store, *args, fault=fault)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    return killed
