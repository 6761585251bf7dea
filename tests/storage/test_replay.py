"""Replay sampling: exact count, determinism, earlier iterations only, cap by history."""

from __future__ import annotations

from pathlib import Path

import pytest

from storage.replay import replay_count, replay_sample
from storage.store import RunStore


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> RunStore:
    """Iterations 0-3 committed with 300 PRM label rows each; iteration 4 left uncommitted."""
    store = RunStore(tmp_path_factory.mktemp("replay"))
    with store.open_run("r1", {}) as run:
        for k in range(5):
            rows = [
                {
                    "problem_id": f"p{i // 10}",
                    "sample_index": i // 3 % 3,
                    "step_index": i % 3,
                    "step_text": f"step {i} of iteration {k}",
                    "step_end_token": 5,
                    "n_completions": 4,
                    "n_correct": i % 5,
                    "hard_label": int(i % 5 > 0),
                    "soft_label": (i % 5) / 4,
                }
                for i in range(300)
            ]
            if k < 4:
                with run.stage(k, "label") as a:
                    a.write("prm_labels", rows)
                continue
            with pytest.raises(RuntimeError), run.stage(k, "label") as a:
                a.write("prm_labels", rows)
                raise RuntimeError("crash before commit")
    return store


def sample(store: RunStore, **kw: object) -> list[tuple[object, ...]]:
    args: dict[str, object] = {
        "table": "prm_labels",
        "run_id": "r1",
        "before_iteration": 3,
        "n_new": 900,
        "seed": 7,
    }
    args.update(kw)
    t = replay_sample(store, **args)  # type: ignore[arg-type]
    return list(zip(*(t.column(c).to_pylist() for c in ("iteration", "step_text")), strict=True))


@pytest.mark.parametrize(
    ("n_new", "ratio", "available", "expected"),
    [
        (900, 0.1, 10_000, 100),
        (90, 0.1, 10_000, 10),
        (900, 0.1, 40, 40),
        (5, 0.0, 9, 0),
        (3, 0.5, 9, 3),
    ],
)
def test_replay_count(n_new: int, ratio: float, available: int, expected: int) -> None:
    assert replay_count(n_new, ratio, available) == expected


@pytest.mark.parametrize("ratio", [-0.1, 1.0, 1.5])
def test_ratio_outside_0_1_is_refused(store: RunStore, ratio: float) -> None:
    with pytest.raises(ValueError, match=r"ratio must be in \[0, 1\)"):
        sample(store, ratio=ratio)


def test_exact_count_from_earlier_iterations_only(store: RunStore) -> None:
    rows = sample(store)
    assert len(rows) == 100 == len(set(rows))
    assert {it for it, _ in rows} <= {0, 1, 2}
    assert all(text.endswith(f"iteration {it}") for it, text in rows)  # type: ignore[union-attr]


def test_deterministic_for_a_seed_and_different_for_another(store: RunStore) -> None:
    assert sample(store) == sample(store)
    assert sample(store, seed=8) != sample(store)
    assert sample(store, n_new=450) == sample(store)[:50]


def test_capped_by_history_and_uncommitted_rows_are_never_drawn(store: RunStore) -> None:
    rows = sample(store, before_iteration=5, n_new=100_000)
    assert len(rows) == 1200  # iterations 0-3; iteration 4 never committed
    assert sample(store, before_iteration=0) == []


def test_full_rows_in_table_schema(store: RunStore) -> None:
    t = replay_sample(store, table="prm_labels", run_id="r1", before_iteration=2, n_new=90, seed=1)
    assert t.schema == store.read("prm_labels").schema
    assert t.num_rows == 10
    narrow = replay_sample(
        store,
        table="prm_labels",
        run_id="r1",
        before_iteration=2,
        n_new=90,
        seed=1,
        columns=["problem_id", "soft_label"],
    )
    assert narrow.column_names == ["iteration", "problem_id", "soft_label"]
    assert narrow.column("problem_id") == t.column("problem_id")


def test_store_path_is_accepted(store: RunStore) -> None:
    by_path = replay_sample(
        Path(store.root), table="prm_labels", run_id="r1", before_iteration=3, n_new=900, seed=7
    )
    assert by_path.column("step_text").to_pylist() == [t for _, t in sample(store)]
