"""storage/fork.py: a forked run holds the source's rows (under its own run id), checkpoints
and commits of the stages asked for, is an ordinary run for every reader, and a fork that
fails leaves no committed stage behind."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from storage.checkpoints import checkpoint_path
from storage.errors import StageAlreadyCommittedError, StoreError
from storage.fork import fork_run
from storage.sql import run_query
from storage.store import RunStore

STAGES = [("warm_start", 0), ("rollout", 0), ("label", 0)]


def rollout_rows(run_id: str) -> list[dict[str, Any]]:
    return [
        {
            "problem_id": f"p{i}",
            "sample_index": i,
            "prompt_text": "1+1=",
            "completion": str(i),
            "n_prompt_tokens": 4,
            "n_completion_tokens": 1,
            "finish_reason": "stop",
            "temperature": 1.0,
            "top_p": 1.0,
            "seed": 7,
            "policy_checkpoint": f"checkpoints/{run_id}/policy/iter-0",
            "correct": i == 2,
            "extracted_answer": str(i),
        }
        for i in range(3)
    ]


def make_source(store: RunStore) -> None:
    """Run A: warm_start (a metric, policy/iter-0), rollout (second attempt), label, and a
    train_rm stage whose files a fork through label must not take."""
    with store.open_run("A", {"seed": 1, "arm": "a"}) as run:
        policy = checkpoint_path(store.root, "A", "policy", 0)
        (policy / "sub").mkdir(parents=True)
        (policy / "config.json").write_text("{}")
        (policy / "sub" / "weights.bin").write_bytes(b"\x00\x01")
        with run.stage(0, "warm_start") as attempt:
            attempt.write("metrics", [{"stage": "warm_start", "name": "loss", "value": 0.5}])
        failed = run.stage(0, "rollout")  # an attempt that failed before committing
        failed.begin()
        failed.write("rollouts", rollout_rows("A")[:1])
        with run.stage(0, "rollout") as attempt:
            attempt.write("rollouts", rollout_rows("A"))
            attempt.info["note"] = "kept"
        with run.stage(0, "label") as attempt:
            attempt.write("orm_labels", [{"problem_id": "p0", "sample_index": 0, "label": 1}])
        checkpoint_path(store.root, "A", "orm", 0).mkdir(parents=True)
        with run.stage(0, "train_rm") as attempt:
            attempt.write("metrics", [{"stage": "train_rm", "name": "loss", "value": 0.1}])
        run.set_status("completed")


def fork(store: RunStore, stages: list[tuple[str, int]] = STAGES) -> None:
    fork_run(
        store,
        "A",
        "B",
        {"seed": 1, "arm": "b"},
        stages=stages,
        checkpoints=[
            ("policy", 0),
            ("prm", 0),  # absent in A: skipped
        ],
    )


def rows(store: RunStore, table: str, run_id: str) -> list[dict[str, Any]]:
    return store.read(table, run_id=run_id).drop(["run_id"]).to_pylist()


def test_fork_reads_back_as_the_source(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    make_source(store)
    fork(store)
    warm = [r for r in rows(store, "metrics", "A") if r["stage"] == "warm_start"]
    assert rows(store, "metrics", "B") == warm  # not train_rm's
    assert rows(store, "orm_labels", "B") == rows(store, "orm_labels", "A")
    a, b = rows(store, "rollouts", "A"), rows(store, "rollouts", "B")
    assert {r["policy_checkpoint"] for r in b} == {"checkpoints/B/policy/iter-0"}
    for r in a:
        r["policy_checkpoint"] = "checkpoints/B/policy/iter-0"
    assert a == b
    # the checkpoint, file for file; the ORM of the stage not forked is not there
    src, dst = (checkpoint_path(store.root, r, "policy", 0) for r in ("A", "B"))
    assert (dst / "sub" / "weights.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.relative_to(dst) for p in dst.rglob("*")) == sorted(
        p.relative_to(src) for p in src.rglob("*")
    )
    assert not checkpoint_path(store.root, "B", "orm", 0).exists()
    assert not checkpoint_path(store.root, "B", "prm", 0).exists()
    # the commits: same stages, attempts and order, each naming where it came from
    commits_a = store.committed_stages("A")[:3]
    commits_b = store.committed_stages("B")
    assert [(s["stage"], s["iteration"], s["attempt"]) for s in commits_b] == [
        (s["stage"], s["iteration"], s["attempt"]) for s in commits_a
    ]
    assert [s["attempt"] for s in commits_b] == [1, 2, 1]
    assert commits_b[1]["info"] == {"note": "kept", "forked_from": "A"}
    # a run like any other: listed with its provenance, queried by SQL, its own config
    status = {r["run_id"]: r for r in store.runs()}["B"]
    assert status["forked_from"] == {"run_id": "A", "through": ["label", 0]}
    assert store.run_config("B") == {"seed": 1, "arm": "b"}
    got = run_query(store, "SELECT count(*) AS n FROM rollouts WHERE run_id = 'B'")
    assert got.column("n").to_pylist() == [3]
    stages = run_query(store, "SELECT stage FROM stages WHERE run_id = 'B' ORDER BY committed_at")
    assert stages.column("stage").to_pylist() == ["warm_start", "rollout", "label"]
    # resuming: the forked stages are committed (the loop skips them), the next one is not
    with store.open_run("B", {"seed": 1, "arm": "b"}) as run:
        assert all(run.is_committed(it, stage) for stage, it in STAGES)
        assert not run.is_committed(0, "train_rm")
        with pytest.raises(StageAlreadyCommittedError):
            run.stage(0, "label").begin()
        with run.stage(0, "train_rm") as attempt:
            attempt.write("metrics", [{"stage": "train_rm", "name": "loss", "value": 0.2}])
    assert sorted(r["value"] for r in rows(store, "metrics", "B")) == [0.2, 0.5]
    # A is untouched
    assert sorted(r["value"] for r in rows(store, "metrics", "A")) == [0.1, 0.5]
    assert json.loads((store.run_dir("A") / "status.json").read_text())["status"] == "completed"


def test_failing_fork_leaves_no_committed_stage(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = RunStore(tmp_path)
    make_source(store)
    import storage.fork as fork_module

    real = fork_module.atomic_write_parquet
    calls = []

    def fail_on_second_commit(path: Path, table: Any) -> None:
        if "tables/stages/" in str(path):
            calls.append(path)
            if len(calls) == 2:
                raise OSError("disk gone")
        real(path, table)

    monkeypatch.setattr(fork_module, "atomic_write_parquet", fail_on_second_commit)
    with pytest.raises(OSError, match="disk gone"):
        fork(store)
    assert store.committed_stages("B") == []
    assert store.read("rollouts", run_id="B").num_rows == 0
    assert not checkpoint_path(store.root, "B", "policy", 0).exists()
    assert "forked_from" not in store.run_status("B")
    # B is a run that failed before its first commit: a second fork (or a run) may start it
    monkeypatch.setattr(fork_module, "atomic_write_parquet", real)
    fork(store)
    assert len(store.committed_stages("B")) == 3


def test_fork_refuses_uncommitted_stages_and_a_started_target(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    make_source(store)
    with pytest.raises(StoreError, match="not committed"):
        fork(store, [("warm_start", 0), ("grpo", 0)])
    fork(store)
    with pytest.raises(StoreError, match="committed stages already"):
        fork(store)
