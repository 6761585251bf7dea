"""grpo.curriculum end to end on `micro`: each GRPO stage stores its questions' pass rates,
and the next iteration draws with the weights those rows give (docs/curriculum.md)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

import pytest

from flows.config_files import load_config
from flows.loop import execute_run
from grpo_core.data.curriculum import difficulty_weight
from storage.store import RunStore
from tests.flow_helpers import micro_config

RUN_ID = "curriculum"
FLOOR = 0.1


@pytest.mark.slow
def test_each_iteration_draws_by_the_pass_rates_of_the_ones_before(tmp_path: Path) -> None:
    cfg = micro_config(
        tmp_path,
        RUN_ID,
        "grpo.curriculum.mode=pass_rate",
        "grpo.curriculum.candidates=3",
        f"grpo.curriculum.floor={FLOOR}",
        "reward_models.use_prm=false",
    )
    execute_run(cfg)
    store = RunStore(tmp_path)
    rates = store.read("problem_pass_rates", run_id=RUN_ID).to_pylist()
    samples = store.read("policy_samples", run_id=RUN_ID).to_pylist()
    assert {r["iteration"] for r in rates} == {0, 1}
    # every stored sample is counted once, under its iteration
    for k in (0, 1):
        counted = sum(r["n_samples"] for r in rates if r["iteration"] == k)
        assert counted == sum(1 for s in samples if s["iteration"] == k) > 0
    # iteration 0 has no history: every question drawn with weight 1
    assert all(r["prior_samples"] == 0 and r["weight"] == 1.0 for r in rates if r["iteration"] == 0)
    # iteration 1 draws with iteration 0's outcomes, and the weight stored is the one applied
    before: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for r in rates:
        if r["iteration"] == 0:
            before[r["question_key"]][0] += r["n_correct"]
            before[r["question_key"]][1] += r["n_samples"]
    later = [r for r in rates if r["iteration"] == 1]
    assert any(r["question_key"] in before for r in later)
    for r in later:
        correct, seen = before.get(r["question_key"], [0, 0])
        assert (r["prior_correct"], r["prior_samples"]) == (correct, seen)
        assert r["weight"] == pytest.approx(difficulty_weight(correct, seen, FLOOR))
        assert r["pass_rate"] == pytest.approx(r["n_correct"] / r["n_samples"])


def test_a_pairs_file_run_refuses_the_curriculum(tmp_path: Path) -> None:
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "1 + 1", "chosen": "2", "rejected": "3"}\n')
    with pytest.raises(ValueError, match=r"grpo\.curriculum\.mode=off"):
        load_config(
            "micro",
            [
                "grpo.preset=offline_dpo",
                f"grpo.pairs_file={pairs}",
                "grpo.curriculum.mode=pass_rate",
            ],
        )
