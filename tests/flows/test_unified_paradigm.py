"""The unified paradigm end to end on `micro` (paper section 5.2.1): SFT trains on gold
solutions, RFT on policy_0's samples, both with their gradient coefficients, stored as rows
of `policy_samples` like GRPO's."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.loop import execute_run
from flows.names import GRPO, POLICY, TRAIN_SPLIT
from flows.runtime import derive_seed
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.data.tasks.registry import make_task
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.policy import load_policy
from grpo_core.model.prompts import Prompter
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
from tests.flow_helpers import micro_config

pytestmark = pytest.mark.slow


def _samples(store: Path, run_id: str, iteration: int) -> list[dict]:  # type: ignore[type-arg]
    table = RunStore(store).read("policy_samples", run_id=run_id)
    rows = [r for r in table.to_pylist() if r["iteration"] == iteration]
    return sorted(rows, key=lambda r: (r["step"], r["problem_id"], r["sample_index"]))


def test_sft_trains_on_the_gold_solutions_with_coefficient_one(tmp_path: Path) -> None:
    cfg = micro_config(tmp_path, "sft", "grpo.preset=sft", "run.iterations=1")
    execute_run(cfg)
    g = cfg.grpo
    pool = make_task(cfg.task).problems(
        TRAIN_SPLIT, g.steps * g.prompts_per_step, seed=derive_seed(cfg.run.seed, GRPO, 0)
    )
    gold = {p.problem_id: p.solution for p in pool}
    samples = _samples(tmp_path, "sft", 0)
    assert len(samples) == g.steps * g.prompts_per_step * g.group_size
    assert all(s["completion"] == gold[s["problem_id"]] for s in samples)
    assert all(s["correct"] and s["advantage"] == 1.0 for s in samples)


def test_rft_trains_on_correct_samples_of_policy_0_in_every_iteration(tmp_path: Path) -> None:
    cfg = micro_config(tmp_path, "rft", "grpo.preset=rft", "run.iterations=2")
    execute_run(cfg)
    # iteration 1 (policy_1 is being trained) still samples policy_0, with the step's seed
    policy_0, tokenizer = load_policy(checkpoint_path(tmp_path, "rft", POLICY, 0))
    g = cfg.grpo
    pool = make_task(cfg.task).problems(
        TRAIN_SPLIT, g.steps * g.prompts_per_step, seed=derive_seed(cfg.run.seed, GRPO, 1)
    )
    prompts = [Prompter(tokenizer)(p.question) for p in pool[: g.prompts_per_step]]
    params = SamplingParams(max_new_tokens=g.max_new_tokens, temperature=g.algo.temperature)
    want = HFRolloutEngine(policy_0, tokenizer, batch_size=cfg.rollout.batch_size).generate(
        prompts, g.group_size, params, seed=derive_seed(cfg.run.seed, GRPO, 1, 0)
    )
    got = [s for s in _samples(tmp_path, "rft", 1) if s["step"] == 0]
    by_row = {(s["problem_id"], s["sample_index"]): s for s in got}
    for r, text in enumerate(want.texts):
        row = by_row[(pool[want.prompt_index[r]].problem_id, r % g.group_size)]
        assert row["completion"] == text
    # the coefficient: 1 for a correct output, 0 otherwise
    for s in _samples(tmp_path, "rft", 0) + _samples(tmp_path, "rft", 1):
        assert s["advantage"] == (1.0 if s["correct"] else 0.0)
