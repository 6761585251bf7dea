"""`grpo.preset=dpo` end to end on `micro`: each GRPO step trains on the pairs it built from
its own groups and stores their count and the DPO figures, and a run killed mid-GRPO
resumes to exactly the uninterrupted run; `grpo.preset=offline_dpo` trains on a pairs file."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from flows.loop import execute_run
from flows.names import GRPO_PROGRESS, TRAIN_SPLIT
from grpo_core.data.tasks.registry import make_task
from storage.checkpoints import EXTRA_FILE, checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import cli, micro_config, snapshot

pytestmark = pytest.mark.slow

RUN_ID = "dpo"
SETTINGS = ("grpo.preset=dpo", "run.iterations=1")
FIGURES = (
    "dpo_pairs",
    "dpo_loss",
    "dpo_reward_margin",
    "dpo_reward_accuracy",
    "dpo_chosen_reward",
    "dpo_rejected_reward",
)


@pytest.fixture(scope="module")
def dpo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store of one uninterrupted DPO run: the metrics test reads it, the kill test
    resumes to it."""
    store = tmp_path_factory.mktemp("dpo")
    execute_run(micro_config(store, RUN_ID, *SETTINGS))
    return store


def grpo_step_metrics(store: RunStore, run_id: str) -> dict[int, dict[str, float]]:
    """Each GRPO step's stored metrics, by name."""
    by_step: dict[int, dict[str, float]] = {}
    for m in store.read("metrics", run_id=run_id).to_pylist():
        if m["stage"] == "grpo" and m["step"] is not None:
            by_step.setdefault(m["step"], {})[m["name"]] = m["value"]
    return by_step


def test_the_dpo_preset_stores_each_steps_pairs_and_figures(dpo_run: Path) -> None:
    store = RunStore(dpo_run)
    by_step = grpo_step_metrics(store, RUN_ID)
    assert sorted(by_step) == [0, 1, 2]
    samples = store.read("policy_samples", run_id=RUN_ID).to_pylist()
    trained = [step for step, values in by_step.items() if "skipped" not in values]
    assert trained  # micro's policy answers some prompts right and some wrong
    for step in trained:
        values = by_step[step]
        assert set(FIGURES) <= set(values) and "kl" not in values  # no KL term besides
        # the policy_samples of the step mark each pair: +1 chosen, -1 rejected, 0 none
        sides = [s["advantage"] for s in samples if s["step"] == step]
        assert set(sides) <= {-1.0, 0.0, 1.0}
        assert sides.count(1.0) == sides.count(-1.0) == values["dpo_pairs"] > 0
        chosen = [s["correct"] for s in samples if s["step"] == step and s["advantage"] > 0]
        rejected = [s["correct"] for s in samples if s["step"] == step and s["advantage"] < 0]
        assert all(chosen) and not any(rejected)  # right over wrong, by the verifier
        assert 0.0 <= values["dpo_reward_accuracy"] <= 1.0
        assert values["dpo_reward_margin"] == pytest.approx(
            values["dpo_chosen_reward"] - values["dpo_rejected_reward"], abs=1e-5
        )


def test_a_dpo_run_killed_mid_grpo_resumes_exactly(dpo_run: Path, tmp_path: Path) -> None:
    want = snapshot(RunStore(dpo_run), RUN_ID)
    store = tmp_path / "killed"
    sets = [arg for s in SETTINGS for arg in ("--set", s)]
    killed = cli(
        store, "run", "--config", "micro", "--run-id", RUN_ID, *sets, fault="SIGKILL@grpo:0:2"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    extra = json.loads((checkpoint_path(store, RUN_ID, GRPO_PROGRESS, 0) / EXTRA_FILE).read_text())
    assert extra["next_step"] == 1  # step 0 checkpointed, then the kill
    resumed = cli(store, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert snapshot(RunStore(store), RUN_ID) == want


def test_offline_dpo_trains_on_the_pairs_of_its_file(tmp_path: Path) -> None:
    # chosen: a gold solution of micro's task; rejected: the same with a wrong final answer
    cfg = micro_config(tmp_path, "offline")
    problems = make_task(cfg.task).problems(TRAIN_SPLIT, 6, seed=0)
    lines = [
        {
            "prompt": p.question,
            "chosen": p.solution,
            "rejected": (p.solution or "").replace(f"#### {p.answer}", f"#### {p.answer}0"),
            "answer": p.answer,
        }
        for p in problems
    ]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(line) + "\n" for line in lines))
    settings = ("grpo.preset=offline_dpo", f"grpo.pairs_file={pairs}", "run.iterations=1")
    execute_run(micro_config(tmp_path / "store", "offline", *settings))
    store = RunStore(tmp_path / "store")
    steps = grpo_step_metrics(store, "offline")
    assert sorted(steps) == [0, 1, 2]
    assert all(values["dpo_pairs"] == 4 for values in steps.values())  # prompts_per_step
    samples = store.read("policy_samples", run_id="offline").to_pylist()
    chosen = {line["chosen"] for line in lines}
    for s in samples:
        assert s["advantage"] == (1.0 if s["completion"] in chosen else -1.0)
        assert s["correct"] == (s["advantage"] > 0)  # the file's answers judge both
