"""On-policy distillation end to end on `micro` (configs/distill.yaml's GRPO settings): the
student samples, a teacher checkpoint scores each sampled token, each token's reward is its
advantage, the per-step reverse KL reaches the stored metrics, and a run killed mid-GRPO
resumes to exactly the uninterrupted run."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.loop import execute_run
from grpo_core.model.config import PolicyConfig
from grpo_core.model.policy import build_char_tokenizer, create_tiny_policy
from storage.store import RunStore
from tests.flow_helpers import cli, killed_micro_run, micro_config, snapshot

pytestmark = pytest.mark.slow

RUN_ID = "distill"
# configs/distill.yaml's distillation on micro's task and student, one iteration, no reward
# model (the teacher is the reward): its GRPO stage and the evaluation of policy_1
SETTINGS = (
    "run.iterations=1",
    "run.stages=[grpo, evaluate]",
    "reward_models.use_orm=false",
    "reward_models.use_prm=false",
    "grpo.algo.adv_estimator=distill",
    "grpo.algo.beta=0",
    "grpo.rewards.verifier=0",
    "grpo.rewards.orm=0",
    "grpo.rewards.teacher=1",
)


@pytest.fixture(scope="module")
def teacher(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A teacher twice the student's depth and width, of the built-in character tokenizer."""
    path = tmp_path_factory.mktemp("teacher")
    tokenizer = build_char_tokenizer()
    cfg = PolicyConfig(n_layers=2, hidden_size=64, n_heads=4, intermediate_size=128, seed=5)
    create_tiny_policy(cfg, tokenizer).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def settings(teacher: Path) -> list[str]:
    return [*SETTINGS, f"grpo.rewards.teacher_path={teacher}"]


@pytest.fixture(scope="module")
def distill_run(tmp_path_factory: pytest.TempPathFactory, teacher: Path) -> Path:
    """The store of one uninterrupted distillation run: the checks read it, the kill test
    resumes to it."""
    store = tmp_path_factory.mktemp("distill")
    execute_run(micro_config(store, RUN_ID, *settings(teacher)))
    return store


def test_each_token_is_rewarded_by_the_teacher_and_the_reverse_kl_is_stored(
    distill_run: Path,
) -> None:
    store = RunStore(distill_run)
    samples = store.read("policy_samples", run_id=RUN_ID).to_pylist()
    assert {s["step"] for s in samples} == {0, 1, 2}
    scored = [s for s in samples if s["n_completion_tokens"] > 0]
    assert scored
    for s in scored:
        parts = dict(s["reward_parts"])
        # the stored reward is the sum of the token rewards, the advantage their mean (A_t = r_t)
        assert s["reward"] == pytest.approx(parts["teacher"], abs=1e-5)
        assert s["advantage"] == pytest.approx(
            parts["teacher"] / s["n_completion_tokens"], abs=1e-5
        )
        assert "verifier" in parts  # still measured, at weight 0
    assert {s["kl"] for s in samples} == {None}  # beta 0: no KL to the reference
    metrics = store.read("metrics", run_id=RUN_ID).to_pylist()
    per_step = {m["step"]: m["value"] for m in metrics if m["name"] == "token_reward_mean"}
    assert sorted(per_step) == [0, 1, 2]
    # a random teacher is far from the student: minus the reverse KL per token, well below 0
    assert all(value < -0.1 for value in per_step.values())
    evaluated = {e["policy_iteration"] for e in store.read("eval", run_id=RUN_ID).to_pylist()}
    assert 1 in evaluated  # the student's accuracy after its distillation


def test_a_distillation_run_killed_mid_grpo_resumes_exactly(
    distill_run: Path, teacher: Path, tmp_path: Path
) -> None:
    want = snapshot(RunStore(distill_run), RUN_ID)
    store = tmp_path / "killed"
    killed_micro_run(store, RUN_ID, settings(teacher), fault="SIGKILL@grpo:0:2")
    resumed = cli(store, "resume", RUN_ID)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "GRPO: resuming at step 1" in resumed.stderr
    assert snapshot(RunStore(store), RUN_ID) == want
