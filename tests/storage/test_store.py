"""Run store: stage commits, crash safety, schema checks, config and status, bad input."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pyarrow as pa
import pytest

from storage.atomic import atomic_directory
from storage.errors import (
    ConfigMismatchError,
    CorruptFileError,
    NonFiniteValueError,
    SchemaMismatchError,
    StageAlreadyCommittedError,
    StorePathError,
    UnknownTableError,
)
from storage.store import RunStore, resolve_store_root
from tests.flow_helpers import commit_a_stage


def orm_rows(n: int, start: int = 0) -> list[dict[str, object]]:
    return [
        {"problem_id": f"p{i}", "sample_index": i % 4, "label": i % 2}
        for i in range(start, start + n)
    ]


def data_files(root: Path) -> list[str]:
    """Every data file: in tables/ (committed) and attempts/ (uncommitted, superseded)."""
    return sorted(
        str(p.relative_to(root))
        for area in ("tables", "attempts")
        for p in (root / area).rglob("*")
        if p.is_file()
    )


def test_committed_stage_is_visible_and_reported(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {"seed": 1}) as run:
        assert not run.is_committed(0, "label")
        with run.stage(0, "label") as attempt:
            attempt.write("orm_labels", orm_rows(3))
            attempt.write("orm_labels", orm_rows(2, start=3))
            attempt.info["note"] = "first"
        assert run.is_committed(0, "label")
        assert not run.is_committed(1, "label")
    table = store.read("orm_labels", run_id="r1")
    assert table.column("problem_id").to_pylist() == ["p0", "p1", "p2", "p3", "p4"]
    assert table.column("iteration").to_pylist() == [0] * 5
    assert table.schema.field("label").type == pa.int8()
    (log,) = store.committed_stages("r1")
    assert (log["stage"], log["attempt"], log["n_rows"]) == ("label", 1, 5)
    assert log["outputs"] == {"orm_labels": 5} and log["info"] == {"note": "first"}


def test_exception_inside_stage_leaves_nothing_visible_and_rerun_cleans_up(
    tmp_path: Path,
) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run:
        with pytest.raises(RuntimeError, match="boom"), run.stage(0, "label") as attempt:
            attempt.write("orm_labels", orm_rows(4))
            raise RuntimeError("boom")
        assert not run.is_committed(0, "label")
        assert store.read("orm_labels").num_rows == 0
        assert data_files(tmp_path) == [
            "attempts/uncommitted/orm_labels/run_id=r1/iteration=0/label-1.parquet"
        ]

        with run.stage(0, "label") as attempt:
            attempt.write("orm_labels", orm_rows(2))
        assert attempt.attempt == 2
    assert data_files(tmp_path) == [
        "tables/orm_labels/run_id=r1/iteration=0/label-2.parquet",
        "tables/stages/run_id=r1/iteration=0/label-2.parquet",
    ]
    assert store.read("orm_labels").num_rows == 2


def test_committed_stage_cannot_be_started_or_committed_again(tmp_path: Path) -> None:
    with RunStore(tmp_path).open_run("r1", {}) as run:
        with run.stage(0, "label") as attempt:
            attempt.write("orm_labels", orm_rows(1))
            attempt.commit({"explicit": True})
            with pytest.raises(StageAlreadyCommittedError):
                attempt.commit()
            with pytest.raises(StageAlreadyCommittedError):
                attempt.write("orm_labels", orm_rows(1))
        with pytest.raises(StageAlreadyCommittedError, match="already committed"):
            run.stage(0, "label").__enter__()
    (log,) = RunStore(tmp_path).committed_stages("r1")
    assert log["info"] == {"explicit": True}


def test_a_superseding_attempt_replaces_the_commit_for_readers_and_keeps_the_old_files(
    tmp_path: Path,
) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run:
        with run.stage(0, "label") as a:
            a.write("orm_labels", orm_rows(2))
        # A failed superseding attempt leaves the first commit as it was.
        with pytest.raises(RuntimeError), run.stage(0, "label", supersede=True) as b:
            b.write("orm_labels", orm_rows(7))
            raise RuntimeError("boom")
        assert store.read("orm_labels").num_rows == 2
        with run.stage(0, "label", supersede=True) as c:
            c.write("orm_labels", orm_rows(5, start=10))
        assert (a.attempt, c.attempt) == (1, 3)
        assert run.committed_attempt(0, "label") == 3
    assert sorted(store.read("orm_labels").column("problem_id").to_pylist()) == [
        f"p{i}" for i in range(10, 15)
    ]
    (log,) = store.committed_stages("r1")
    assert (log["attempt"], log["n_rows"]) == (3, 5)
    assert data_files(tmp_path) == [
        "attempts/superseded/orm_labels/run_id=r1/iteration=0/label-1.parquet",
        "attempts/superseded/stages/run_id=r1/iteration=0/label-1.parquet",
        "tables/orm_labels/run_id=r1/iteration=0/label-3.parquet",
        "tables/stages/run_id=r1/iteration=0/label-3.parquet",
    ]


def test_a_superseding_attempt_refuses_to_commit_over_a_newer_commit(tmp_path: Path) -> None:
    with RunStore(tmp_path).open_run("r1", {}) as run:
        with run.stage(0, "label") as first:
            first.write("orm_labels", orm_rows(1))
        late = run.stage(0, "label", supersede=True)
        late.begin()
        with run.stage(0, "label", supersede=True) as other:
            other.write("orm_labels", orm_rows(2))
        with pytest.raises(StageAlreadyCommittedError, match="another attempt"):
            late.commit()


def test_other_stages_and_iterations_are_untouched_by_a_rerun(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run:
        with run.stage(0, "rollout") as a:
            a.write("orm_labels", orm_rows(1))
        with pytest.raises(KeyError), run.stage(0, "label") as a:
            a.write("orm_labels", orm_rows(5))
            raise KeyError
        with run.stage(0, "label") as a:
            a.write("orm_labels", orm_rows(2))
    assert store.read("orm_labels").num_rows == 3


def test_rows_of_one_stage_read_by_its_name(tmp_path: Path) -> None:
    """A table without a stage column (orm_labels here, eval in a run) read per stage."""
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run:
        with run.stage(0, "rollout") as a:
            a.write("orm_labels", orm_rows(1))
        with run.stage(0, "label") as a:
            a.write("orm_labels", orm_rows(2))
        unfinished = run.stage(1, "label")
        unfinished.begin()
        unfinished.write("orm_labels", orm_rows(4))
    assert store.read("orm_labels", stage="label").num_rows == 2
    assert store.read("orm_labels", stage="rollout").num_rows == 1
    assert store.read("orm_labels", stage="grpo").num_rows == 0
    assert [r["stage"] for r in store.read("stages", stage="label").to_pylist()] == ["label"]


def test_schema_mismatch_names_column_and_types(tmp_path: Path) -> None:
    with RunStore(tmp_path).open_run("r1", {}) as run, run.stage(0, "label") as a:
        with pytest.raises(SchemaMismatchError, match=r"'label'.*expected int8, got str"):
            a.write("orm_labels", [{"problem_id": "p", "sample_index": 0, "label": "yes"}])
        with pytest.raises(SchemaMismatchError, match=r"missing required column 'sample_index'"):
            a.write("orm_labels", [{"problem_id": "p", "label": 1}])
        with pytest.raises(SchemaMismatchError, match=r"no column\(s\) \['lable'\]"):
            a.write("orm_labels", [{"problem_id": "p", "sample_index": 0, "lable": 1}])
        bad = pa.table(
            {"problem_id": ["p"], "sample_index": [0.5], "label": pa.array([1], pa.int8())}
        )
        with pytest.raises(
            SchemaMismatchError, match=r"'sample_index'.*expected int32, got double"
        ):
            a.write("orm_labels", bad)
        with pytest.raises(SchemaMismatchError, match=r"'problem_id'.*required"):
            a.write("orm_labels", [{"problem_id": None, "sample_index": 0, "label": 1}])
        with pytest.raises(UnknownTableError, match="orm_labels, policy_samples"):
            a.write("orm_label", orm_rows(1))
        a.write("orm_labels", pa.table({"problem_id": ["p"], "sample_index": [1], "label": [1]}))


def test_nullable_columns_may_be_omitted(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run, run.stage(0, "evaluate") as a:
        a.write(
            "eval",
            [
                {
                    "policy_iteration": 0,
                    "split": "test",
                    "metric": "greedy_acc",
                    "value": 0.5,
                    "n": 10,
                }
            ],
        )
    row = store.read("eval").to_pylist()[0]
    assert row["k"] is None and row["stderr"] is None and row["value"] == 0.5


def test_store_path_that_is_a_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "store"
    path.write_text("not a directory")
    with pytest.raises(StorePathError, match="is a file"):
        RunStore(path)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_store_path_not_writable_is_refused(tmp_path: Path) -> None:
    tmp_path.chmod(0o500)
    try:
        with pytest.raises(StorePathError, match="not writable"):
            RunStore(tmp_path).open_run("r1", {})
    finally:
        tmp_path.chmod(0o700)


def test_store_root_from_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ITERGRPO_STORE", str(tmp_path / "s"))
    assert RunStore().root == tmp_path / "s"


def test_store_precedence_is_flag_then_env_then_config_then_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ITERGRPO_STORE", raising=False)
    assert resolve_store_root(None, "") == tmp_path / "itergrpo-store"
    assert resolve_store_root(None, "cfg") == tmp_path / "cfg"
    monkeypatch.setenv("ITERGRPO_STORE", "env/")
    assert resolve_store_root(None, "cfg") == tmp_path / "env"
    assert resolve_store_root("flag", "cfg") == tmp_path / "flag"
    assert resolve_store_root("  ", "cfg") == tmp_path / "env"  # blank is not a choice


def test_config_mismatch_is_refused_unless_forced(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    commit_a_stage(store, "r1", {"grpo": {"lr": 1e-6, "beta": 0.04}, "seed": 1})
    with store.open_run("r1", {"grpo": {"lr": 1e-6, "beta": 0.04}, "seed": 1}):
        pass
    with pytest.raises(ConfigMismatchError, match=r"grpo\.beta, seed") as err:
        store.open_run("r1", {"grpo": {"lr": 1e-6, "beta": 0.1}, "seed": 2})
    assert err.value.keys == ["grpo.beta", "seed"]
    assert store.run_config("r1")["grpo"]["beta"] == 0.04
    with store.open_run("r1", {"grpo": {"lr": 1e-6, "beta": 0.1}}, force_config=True):
        pass
    assert store.run_config("r1") == {"grpo": {"lr": 1e-6, "beta": 0.1}}
    (old,) = (tmp_path / "runs" / "r1").glob("config.*.yaml")
    assert "beta: 0.04" in old.read_text()


def test_a_run_that_never_committed_takes_the_corrected_config(tmp_path: Path) -> None:
    """A run refused or failed before its first commit holds nothing the new config could
    contradict: rerunning it corrected is not 'a different config'."""
    store = RunStore(tmp_path)
    with store.open_run("r1", {"policy": {"path": "/typo"}}):
        pass
    store.check_can_open("r1", {"policy": {"path": "/right"}})
    with store.open_run("r1", {"policy": {"path": "/right"}}):
        pass
    assert store.run_config("r1") == {"policy": {"path": "/right"}}
    (old,) = (tmp_path / "runs" / "r1").glob("config.*.yaml")
    assert "/typo" in old.read_text()


def test_invalid_run_id_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="invalid run id"):
        RunStore(tmp_path).open_run("../etc", {})


def test_status_and_runs(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run:
        run.set_status("running", iterations_done=2)
        (info,) = store.runs()
    assert (info["run_id"], info["status"], info["iterations_done"]) == ("r1", "running", 2)
    assert "created_at" in info
    # its process gone without recording an end (kill -9): not shown as running
    assert store.runs()[0]["status"] == "interrupted (stale)"
    status = json.loads((tmp_path / "runs" / "r1" / "status.json").read_text())
    assert status["status"] == "running"


def test_corrupt_file_is_reported_with_its_path(tmp_path: Path) -> None:
    store = RunStore(tmp_path)
    with store.open_run("r1", {}) as run:
        for k in range(2):
            with run.stage(k, "label") as a:
                a.write("orm_labels", orm_rows(3))
    bad = store.committed_files("orm_labels", iterations=[1])[0]
    bad.write_bytes(b"PAR1 garbage")
    with pytest.raises(CorruptFileError) as err:
        store.read("orm_labels")
    assert err.value.path == bad and str(bad) in str(err.value)
    assert store.read("orm_labels", iterations=[0]).num_rows == 3


def test_atomic_directory_replaces_only_on_success(tmp_path: Path) -> None:
    final = tmp_path / "ckpt"
    with atomic_directory(final) as tmp:
        (tmp / "a.txt").write_text("v1")
    with pytest.raises(FileExistsError):
        atomic_directory(final).__enter__()
    with pytest.raises(RuntimeError), atomic_directory(final, overwrite=True) as tmp:
        (tmp / "a.txt").write_text("v2")
        raise RuntimeError
    assert (final / "a.txt").read_text() == "v1"
    with atomic_directory(final, overwrite=True) as tmp:
        (tmp / "a.txt").write_text("v2")
    assert (final / "a.txt").read_text() == "v2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_nan_and_inf_are_never_written(tmp_path: Path, bad: float) -> None:
    store = RunStore(tmp_path)
    rows = [
        {"stage": "grpo", "step": 0, "name": "kl", "value": 0.1},
        {"stage": "grpo", "step": 0, "name": "loss", "value": bad},
    ]
    refused = pytest.raises(
        NonFiniteValueError, match=r"'metrics', column 'value'.*row 1 \(name 'loss'\)"
    )
    with store.open_run("r1", {}) as run, refused, run.stage(0, "grpo") as attempt:
        attempt.write("metrics", rows)
    assert store.read("metrics", run_id="r1").num_rows == 0
    assert not list((tmp_path / "tables").rglob("*.parquet"))  # no data, no commit


def test_policy_samples_stored_before_reward_parts_read_their_parts_by_name(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A read-time migration: files with one column per reward part (reward_verifier,
    reward_format) read as reward_parts, beside newer files, in Python and in SQL, and the
    files themselves are never rewritten."""
    import pyarrow as pa

    from storage import schemas
    from storage.sql import run_query

    new = schemas.TABLE_SCHEMAS["policy_samples"]
    old = pa.schema(
        [f for f in new if f.name != "reward_parts"]
        + [pa.field("reward_verifier", pa.float64()), pa.field("reward_format", pa.float64())]
    )
    row = {
        "step": 0,
        "problem_id": "p",
        "sample_index": 0,
        "completion": "#### 2",
        "reward": 1.0,
        "reward_rm": None,
        "advantage": 0.5,
        "kl": 0.0,
        "ratio_mean": 1.0,
        "ratio_max": 1.0,
        "n_completion_tokens": 3,
        "correct": True,
    }
    store = RunStore(tmp_path)
    with store.open_run("r", {}) as run:
        monkeypatch.setitem(schemas.TABLE_SCHEMAS, "policy_samples", old)
        with run.stage(0, "grpo") as attempt:  # as an earlier version wrote it
            attempt.write("policy_samples", [{**row, "reward_verifier": 1.0, "reward_format": 0.0}])
        monkeypatch.setitem(schemas.TABLE_SCHEMAS, "policy_samples", new)
        with run.stage(1, "grpo") as attempt:
            parts = {"verifier": 0.0, "format": 1.0, "orm": 0.25}
            attempt.write("policy_samples", [{**row, "reward_parts": parts}])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.parquet")}
    got = store.read("policy_samples", run_id="r").to_pylist()
    assert [dict(r["reward_parts"]) for r in sorted(got, key=lambda r: r["iteration"])] == [
        {"verifier": 1.0, "format": 0.0},
        {"verifier": 0.0, "format": 1.0, "orm": 0.25},
    ]
    sql = run_query(
        store,
        "SELECT iteration, reward_parts['verifier'] AS v, reward_parts['orm'] AS orm "
        "FROM policy_samples ORDER BY iteration",
    ).to_pylist()
    assert sql == [{"iteration": 0, "v": 1.0, "orm": None}, {"iteration": 1, "v": 0.0, "orm": 0.25}]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.parquet")} == before


def test_policy_samples_stored_before_truncated_read_it_as_null(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files written before the truncated column read beside newer ones: NULL (unknown, not
    False) in Python and in SQL, and the files are not rewritten."""
    import pyarrow as pa

    from storage import schemas
    from storage.sql import run_query

    new = schemas.TABLE_SCHEMAS["policy_samples"]
    old = pa.schema([f for f in new if f.name != "truncated"])
    row = {
        "step": 0,
        "problem_id": "p",
        "sample_index": 0,
        "completion": "1 + 1 = 2 and on and on",
        "reward": 0.0,
        "advantage": 0.0,
        "kl": 0.0,
        "ratio_mean": 1.0,
        "ratio_max": 1.0,
        "n_completion_tokens": 8,
        "correct": False,
    }
    store = RunStore(tmp_path)
    with store.open_run("r", {}) as run:
        monkeypatch.setitem(schemas.TABLE_SCHEMAS, "policy_samples", old)
        with run.stage(0, "grpo") as attempt:  # as an earlier version wrote it
            attempt.write("policy_samples", [row])
        monkeypatch.setitem(schemas.TABLE_SCHEMAS, "policy_samples", new)
        with run.stage(1, "grpo") as attempt:
            attempt.write("policy_samples", [{**row, "truncated": True}])
    before = {p: p.read_bytes() for p in tmp_path.rglob("*.parquet")}
    got = sorted(store.read("policy_samples", run_id="r").to_pylist(), key=lambda r: r["iteration"])
    assert [r["truncated"] for r in got] == [None, True]
    sql = run_query(
        store, "SELECT iteration, truncated FROM policy_samples ORDER BY iteration"
    ).to_pylist()
    assert sql == [{"iteration": 0, "truncated": None}, {"iteration": 1, "truncated": True}]
    assert {p: p.read_bytes() for p in tmp_path.rglob("*.parquet")} == before


def test_a_non_finite_reward_part_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    from storage.errors import NonFiniteValueError

    row = {
        "step": 0,
        "problem_id": "p",
        "sample_index": 0,
        "completion": "",
        "reward": 0.0,
        "reward_parts": {"verifier": 0.0, "orm": float("nan")},
        "advantage": 0.0,
        "kl": 0.0,
        "ratio_mean": 1.0,
        "ratio_max": 1.0,
        "n_completion_tokens": 0,
        "correct": False,
    }
    store = RunStore(tmp_path)
    with (
        store.open_run("r", {}) as run,
        pytest.raises(NonFiniteValueError, match="reward_parts"),
        run.stage(0, "grpo") as attempt,
    ):
        attempt.write("policy_samples", [row])
    assert not list(tmp_path.rglob("*.parquet"))
    # Rows without reward parts (or with none scored) have no non-finite value to refuse.
    with store.open_run("r", {}) as run, run.stage(0, "grpo") as attempt:
        attempt.write("policy_samples", [{**row, "reward_parts": None}])
        attempt.write("policy_samples", [{**row, "reward_parts": {}}])
    assert [r["reward_parts"] for r in store.read("policy_samples").to_pylist()] == [None, []]
