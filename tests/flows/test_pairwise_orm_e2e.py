"""`reward_models.orm.objective=pairwise` end to end on `micro` (2 iterations): the ORM trains
on the (right, wrong) pairs of each iteration's groups plus a replay of iteration 0's pairs,
its pairwise accuracy is stored beside its AUROC, the PRM still trains pointwise from it, and a
run killed in iteration 1's train_rm stage resumes to exactly the uninterrupted run."""

from __future__ import annotations

import signal
from collections import Counter
from pathlib import Path

import pytest

from flows.loop import execute_run
from reward_models.pairwise import outcome_pairs
from storage.replay import replay_count
from storage.store import RunStore
from tests.flow_helpers import cli, micro_config, snapshot

pytestmark = pytest.mark.slow
RUN_ID = "pairwise"
SETTINGS = ("reward_models.orm.objective=pairwise",)


@pytest.fixture(scope="module")
def pairwise_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store of one uninterrupted run: the metrics test reads it, the kill test resumes
    to it."""
    store = tmp_path_factory.mktemp("pairwise")
    execute_run(micro_config(store, RUN_ID, *SETTINGS))
    return store


def _pairs_by_problem(labels: list[dict[str, int]]) -> dict[str, int]:
    by_problem: dict[str, list[int]] = {}
    for row in sorted(labels, key=lambda r: r["sample_index"]):
        by_problem.setdefault(str(row["problem_id"]), []).append(int(row["label"]))
    return {p: len(outcome_pairs(ys)) for p, ys in by_problem.items()}


def test_the_pairwise_orm_trains_on_pairs_and_their_replay(pairwise_run: Path) -> None:
    store = RunStore(pairwise_run)
    metrics = {
        (m["iteration"], m["name"]): m["value"]
        for m in store.read("metrics", run_id=RUN_ID, stage="train_rm").to_pylist()
    }
    labels = store.read("orm_labels", run_id=RUN_ID).to_pylist()
    pairs = [_pairs_by_problem([r for r in labels if r["iteration"] == k]) for k in (0, 1)]
    new = [sum(p.values()) for p in pairs]
    assert metrics[0, "orm_pairs_new"] == new[0] > 0 and metrics[1, "orm_pairs_new"] == new[1] > 0
    assert metrics[0, "orm_pairs_replay"] == 0
    # replay_ratio 0.1 of the mix's pairs, drawn from iteration 0's
    assert metrics[1, "orm_pairs_replay"] == replay_count(new[1], 0.1, new[0]) > 0
    assert metrics[0, "orm_groups"] == sum(n > 0 for n in pairs[0].values())
    assert metrics[1, "prm_targets"] > 0  # the PRM, from ORM_k, trains pointwise as before
    rm_train = [
        r for r in store.read("rm_train", run_id=RUN_ID).to_pylist() if r["rm_kind"] == "orm"
    ]
    # iteration 0: each output of a prompt with a pair, once per epoch (micro: 2 epochs)
    read = Counter(r["epoch"] for r in rm_train if r["iteration"] == 0)
    assert read == {0: metrics[0, "orm_examples"], 1: metrics[0, "orm_examples"]}
    replayed = [r for r in rm_train if r["iteration"] == 1 and r["source"] == "replay"]
    assert replayed and {r["origin_iteration"] for r in replayed} == {0}
    for r in replayed:  # a replayed output belongs to a prompt of iteration 0 that had a pair
        assert pairs[0][r["problem_id"]] > 0
    evals = {
        (e["policy_iteration"], e["split"], e["metric"])
        for e in store.read("eval", run_id=RUN_ID).to_pylist()
    }
    for split in ("train", "test"):  # beside the AUROC, for ORM_k and (k = 1) ORM_{k-1}
        assert {(0, split, "orm_pair_accuracy"), (0, split, "orm_auroc")} <= evals
        assert {(1, split, "orm_pair_accuracy"), (1, split, "orm_pair_accuracy_stale")} <= evals


def test_a_pairwise_run_killed_in_train_rm_resumes_exactly(
    pairwise_run: Path, tmp_path: Path
) -> None:
    want = snapshot(RunStore(pairwise_run), RUN_ID)
    store = tmp_path / "killed"
    sets = [arg for s in SETTINGS for arg in ("--set", s)]
    # the third report of iteration 1's train_rm: both RMs trained, nothing committed
    killed = cli(
        store, "run", "--config", "micro", "--run-id", RUN_ID, *sets, fault="SIGKILL@train_rm:1:3"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = cli(store, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert snapshot(RunStore(store), RUN_ID) == want
