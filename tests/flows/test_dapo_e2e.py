"""`grpo.preset=dapo` end to end on `micro`: dynamic sampling draws extra prompts, outputs cut
at max_new_tokens are stored as truncated and left out of the loss, and a run killed mid-GRPO
resumes to exactly the uninterrupted run (the prompt cursor travels with the checkpoint)."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest

from flows.loop import execute_run
from flows.names import GRPO_PROGRESS
from flows.report import iteration_table
from storage.checkpoints import EXTRA_FILE, checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import cli, micro_config, snapshot

RUN_ID = "dapo"
# One iteration; a budget of 18 tokens cuts about half the outputs, and groups of two often
# agree, so dynamic sampling has groups to drop (measured: steps draw 5, 4 and 7 prompts).
SETTINGS = (
    "grpo.preset=dapo",
    "run.iterations=1",
    "grpo.max_new_tokens=18",
    "grpo.group_size=2",
)
DYNAMIC = ("prompts_drawn", "groups_dropped", "sampling_rounds", "batch_filled")


@pytest.fixture(scope="module")
def dapo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The store of one uninterrupted DAPO run: the metrics test reads it, the kill test
    resumes to it."""
    store = tmp_path_factory.mktemp("dapo")
    execute_run(micro_config(store, RUN_ID, *SETTINGS))
    return store


def test_the_dapo_preset_runs_micro_and_stores_its_metrics(dapo_run: Path) -> None:
    cfg = micro_config(dapo_run, RUN_ID, *SETTINGS)
    algo = cfg.grpo.algo
    assert (algo.dynamic_sampling, algo.mask_truncated, algo.eps_high, algo.beta) == (
        True,
        True,
        0.28,
        0.0,
    )
    assert cfg.grpo.rewards.weight("overlong") == 1.0
    store = RunStore(dapo_run)
    metrics = store.read("metrics", run_id=RUN_ID).to_pylist()
    grpo = [m for m in metrics if m["stage"] == "grpo" and m["step"] is not None]  # per step
    by_step: dict[int, dict[str, float]] = {}
    for m in grpo:
        by_step.setdefault(m["step"], {})[m["name"]] = m["value"]
    assert sorted(by_step) == [0, 1, 2]
    for values in by_step.values():
        assert set(DYNAMIC) <= set(values)
        # each step found its 4 informative groups; every other prompt drawn was dropped
        assert values["batch_filled"] == 1.0
        assert values["groups_dropped"] == values["prompts_drawn"] - 4
        assert 1 <= values["sampling_rounds"] <= 1 + 3  # the default cap of extra rounds
    assert sum(v["groups_dropped"] for v in by_step.values()) > 0  # extra rounds were used
    samples = store.read("policy_samples", run_id=RUN_ID).to_pylist()
    assert {s["truncated"] for s in samples} == {True, False}
    # the mask: a truncated output has no advantage; its overlong penalty is -1 (at the budget)
    truncated = [s for s in samples if s["truncated"]]
    assert all(s["advantage"] == 0.0 for s in truncated)
    assert all(s["n_completion_tokens"] == 18 for s in truncated)
    assert all(dict(s["reward_parts"])["overlong"] == -1.0 for s in truncated)
    # every step stored its prompts_per_step kept groups of group_size outputs
    assert [sum(1 for s in samples if s["step"] == k) for k in range(3)] == [8, 8, 8]
    # no KL term (beta 0) and no penalty: no `kl` row, a NULL in the samples, "-" in the table
    assert not any("kl" in values for values in by_step.values())
    assert {s["kl"] for s in samples} == {None}
    assert [row["kl"] for row in iteration_table(store, RUN_ID)] == [None, None]


@pytest.mark.slow
def test_a_dapo_run_killed_mid_grpo_resumes_exactly(dapo_run: Path, tmp_path: Path) -> None:
    reference = dapo_run
    want = snapshot(RunStore(reference), RUN_ID)
    drawn = sorted(
        (m["step"], m["value"])
        for m in RunStore(reference).read("metrics", run_id=RUN_ID).to_pylist()
        if m["name"] == "prompts_drawn"
    )
    store = tmp_path / "killed"
    sets = [arg for s in SETTINGS for arg in ("--set", s)]
    killed = cli(
        store, "run", "--config", "micro", "--run-id", RUN_ID, *sets, fault="SIGKILL@grpo:0:2"
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    extra = json.loads((checkpoint_path(store, RUN_ID, GRPO_PROGRESS, 0) / EXTRA_FILE).read_text())
    # step 0 checkpointed: the cursor stands after the prompts step 0 drew, extra rounds too
    assert extra == {"next_step": 1, "next_prompt": int(drawn[0][1])}
    assert extra["next_prompt"] != 4  # what step x prompts_per_step would have said
    resumed = cli(store, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert snapshot(RunStore(store), RUN_ID) == want
