"""A micro run on a 7-row GSM8K-format file with 2 bad rows
(`task.local_files.on_bad_rows: skip`): 5 train problems where each GRPO step asks for 6. Every
step trains on the 5 there are, the run completes, a run killed mid-GRPO resumes to the same
store, and the bad rows are reported once.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from flows.loop import execute_run
from storage.sql import run_query
from storage.store import RunStore
from tests.flow_helpers import cli, micro_config, snapshot

pytestmark = pytest.mark.slow
RUN_ID = "small"
PER_STEP = 6


def write_data(folder: Path) -> tuple[Path, Path]:
    """7 train rows (rows 3 and 6 have no '#### <answer>' line) and 2 test rows."""
    rows = [
        {"question": f"What is {a}+1?", "answer": f"{a}+1={a + 1}\n#### {a + 1}"}
        for a in range(1, 8)
    ]
    rows[2]["answer"] = rows[5]["answer"] = "no final answer line"
    train, test = folder / "train.jsonl", folder / "test.jsonl"
    train.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    test.write_text(
        "\n".join(
            json.dumps({"question": f"What is {a}+2?", "answer": f"#### {a + 2}"}) for a in (1, 2)
        )
        + "\n"
    )
    return train, test


def overrides(train: Path, test: Path) -> list[str]:
    return [
        "task.name=local_files",
        f"task.local_files.path={train}",
        f"task.local_files.test_path={test}",
        "task.local_files.on_bad_rows=skip",
        f"grpo.prompts_per_step={PER_STEP}",
        # 5 valid questions: the warm-started policy gets 19 of 20 rollouts right, too few
        # wrong labels to train an RM on, which the rm_labels guard rightly stops by default
        # (tests/flows/test_guards_e2e.py); this test is about the degenerate GRPO batches
        "guards.rm_labels=warn",
    ]


def test_a_run_on_fewer_problems_than_a_step_asks_for_completes_and_resumes(tmp_path: Path) -> None:
    train, test = write_data(tmp_path)
    sets = overrides(train, test)
    reference = tmp_path / "reference"
    execute_run(micro_config(reference, RUN_ID, *sets))
    want = snapshot(RunStore(reference), RUN_ID)

    store_dir = tmp_path / "store"
    flags = [arg for s in sets for arg in ("--set", s)]
    killed = cli(
        store_dir, "run", "--config", "micro", "--run-id", RUN_ID, *flags, fault="SIGKILL@grpo:0:2"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert killed.stderr.count("dropped 2 bad row(s) of 7") == 1, killed.stderr[-3000:]
    assert "degrees of freedom" not in killed.stderr
    resumed = cli(store_dir, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert resumed.stderr.count("dropped 2 bad row(s) of 7") == 1

    store = RunStore(store_dir)
    assert store.run_status(RUN_ID)["status"] == "completed"
    assert snapshot(store, RUN_ID) == want
    per_step = run_query(
        store,
        "SELECT iteration, step, count(DISTINCT problem_id) AS prompts, count(*) AS outputs "
        f"FROM policy_samples WHERE run_id = '{RUN_ID}' GROUP BY ALL ORDER BY ALL",
    ).to_pylist()
    cfg = micro_config(store_dir, RUN_ID, *sets)
    assert per_step == [
        {"iteration": k, "step": s, "prompts": 5, "outputs": 5 * cfg.grpo.group_size}
        for k in range(cfg.run.iterations)
        for s in range(cfg.grpo.steps)
    ]
    skipped = run_query(
        store, f"SELECT count(*) AS n FROM metrics WHERE run_id = '{RUN_ID}' AND name = 'skipped'"
    ).to_pylist()
    assert skipped == [{"n": 0}]  # fewer prompts is a full step, not a skipped one
