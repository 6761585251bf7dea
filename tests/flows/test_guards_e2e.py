"""A micro run on a GSM8K-format file with the untrained tiny policy (no warm start): no
output is right, every reward-model label is 0, and the rm_labels guard stops the run before
train_rm commits, naming one-class data and the fixes; `resume --set guards.rm_labels=warn`
goes on from the committed stages, and the RMs trained on one class over-pay, which the
over-optimisation guard (set to stop) catches before GRPO commits; a last resume goes on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from storage.sql import run_query
from storage.store import RunStore
from tests.flow_helpers import cli

pytestmark = pytest.mark.slow


def test_one_class_reward_data_stops_the_run_and_a_resume_goes_on(tmp_path: Path) -> None:
    data = _gsm8k_file(tmp_path)
    store_dir = tmp_path / "store"
    untrained = ("--set", "run.warm_start=false", "--set", "run.iterations=1")
    local = ("--set", "task.name=local_files", "--set", f"task.local_files.path={data}")
    stopped = cli(store_dir, "run", "--config", "micro", "--run-id", "g", *local, *untrained)

    assert stopped.returncode == 2, stopped.stderr[-3000:]
    message = stopped.stderr.strip().splitlines()[-1]
    assert "ORM training data of iteration 0 has one class: all 24 labels are 0" in message
    assert "warm-start the policy" in message and "verifier alone" in message
    assert "itergrpo resume g --set guards.rm_labels=warn" in message
    assert "Traceback" not in stopped.stderr
    store = RunStore(store_dir)
    status = store.run_status("g")
    assert status["status"] == "failed"
    assert (status["failure"]["type"], status["failure"]["stage"]) == ("GuardTripped", "train_rm")
    committed = _committed(store)
    assert committed == [(0, "warm_start"), (0, "rollout"), (0, "label")]  # no train_rm
    labels = run_query(store, "SELECT DISTINCT label FROM orm_labels WHERE run_id = 'g'")
    assert labels.to_pylist() == [{"label": 0}]

    # Go on past the labels; the RMs trained on one class then pay ~0.4 for outputs the
    # verifier scores 0, which the over-optimisation guard, set to stop, catches.
    over = ("--set", "guards.over_optimisation=stop", "--set", "guards.over_optimisation_steps=3")
    overpaid = cli(store_dir, "resume", "g", "--set", "guards.rm_labels=warn", *over)

    assert overpaid.returncode == 2, overpaid.stderr[-3000:]
    assert "guard rm_labels: ORM training data of iteration 0 has one class" in overpaid.stderr
    message = overpaid.stderr.strip().splitlines()[-1]
    assert "the learned reward paid 0.4" in message and "more than the verifier" in message
    assert store.run_status("g")["failure"]["stage"] == "grpo"
    assert [s for _, s in _committed(store)] == ["warm_start", "rollout", "label", "train_rm"]

    went_on = cli(store_dir, "resume", "g", "--set", "guards.over_optimisation=warn")

    assert went_on.returncode == 0, went_on.stderr[-3000:]
    assert "guard over_optimisation: GRPO iteration 0" in went_on.stderr
    assert store.run_status("g")["status"] == "completed"
    guards = store.run_config("g")["guards"]
    assert (guards["rm_labels"], guards["over_optimisation"]) == ("warn", "warn")
    again = _committed(store)
    assert again[:3] == committed  # kept, not rerun
    assert [s for _, s in again[3:]] == ["train_rm", "grpo", "evaluate"]
    found = run_query(
        store,
        "SELECT stage, name, value FROM metrics WHERE run_id = 'g' AND name LIKE 'guard_%' "
        "ORDER BY stage, name",
    ).to_pylist()
    assert found == [
        {"stage": "grpo", "name": "guard_equal_rewards", "value": 0.0},
        {"stage": "grpo", "name": "guard_over_optimisation", "value": 1.0},
        {"stage": "train_rm", "name": "guard_rm_labels_orm", "value": 1.0},
        {"stage": "train_rm", "name": "guard_rm_labels_prm", "value": 1.0},
    ]


def _committed(store: RunStore) -> list[tuple[int, str]]:
    return [(r["iteration"], r["stage"]) for r in store.committed_stages("g")]


@pytest.mark.parametrize(
    ("guard", "overrides", "stage", "said"),
    [
        # micro's tiny PRM ranks fresh outputs at AUROC 0.57 in iteration 0 (floor 0.6)
        ("rm_auroc", (), "train_rm", "prm_step_auroc of iteration 0 is 0."),
        # the untrained policy is wrong on every GSM8K question and the verifier is the only
        # reward: every group is rewarded alike at every step
        (
            "equal_rewards",
            (
                "run.warm_start=false",
                "grpo.rewards.orm=0",
                "reward_models.use_orm=false",
                "reward_models.use_prm=false",
            ),
            "grpo",
            "3 of 3 steps had every group's outputs rewarded alike",
        ),
    ],
    ids=["rm_auroc", "equal_rewards"],
)
def test_a_guard_set_to_stop_stops_before_the_commit_and_the_run_goes_on_after(
    tmp_path: Path, guard: str, overrides: tuple[str, ...], stage: str, said: str
) -> None:
    from flows.guards import GuardTripped
    from flows.loop import execute_run
    from tests.flow_helpers import micro_config

    data = _gsm8k_file(tmp_path) if guard == "equal_rewards" else None
    local = ("task.name=local_files", f"task.local_files.path={data}") if data else ()
    base = (*overrides, *local, "run.iterations=1")
    root = tmp_path / "store"
    with pytest.raises(GuardTripped, match=said):
        execute_run(micro_config(root, "r", *base, f"guards.{guard}=stop"))
    store = RunStore(root)
    assert stage not in [r["stage"] for r in store.committed_stages("r")]
    assert store.run_status("r")["failure"]["stage"] == stage

    execute_run(micro_config(root, "r", *base, f"guards.{guard}=warn"))  # the fix

    assert store.run_status("r")["status"] == "completed"
    verdict = run_query(
        store, f"SELECT value FROM metrics WHERE run_id = 'r' AND name LIKE 'guard_{guard}%'"
    ).to_pylist()
    assert {"value": 1.0} in verdict


def _gsm8k_file(folder: Path) -> Path:
    data = folder / "gsm8k.jsonl"
    rows = [
        {"question": f"What is {a}+{b}?", "answer": f"{a}+{b}={a + b}\n#### {a + b}"}
        for a in range(1, 7)
        for b in range(1, 7)
    ]
    data.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    return data
