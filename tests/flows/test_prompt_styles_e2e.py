"""The R1 prompt style end to end at micro scale: the warm start trains on gold solutions laid
out as <think> steps </think> then the answer, the policy learns the layout, and GRPO is paid
the think_format reward part, stored by name with every sample."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.loop import execute_run
from storage.store import RunStore
from tests.flow_helpers import micro_config

pytestmark = pytest.mark.slow

# The R1 template is long for a character tokenizer, and the layout adds ~20 characters.
ROOM = [f"{stage}.max_new_tokens=64" for stage in ("grpo", "rollout", "evaluation", "labelling")]


def test_an_r1_run_learns_the_think_layout_and_is_paid_for_it(tmp_path: Path) -> None:
    cfg = micro_config(
        tmp_path,
        "r1",
        "prompt.style=r1",
        "grpo.rewards.think_format=0.5",
        "policy.max_position_embeddings=512",
        "run.iterations=1",
        *ROOM,
    )
    execute_run(cfg)
    store = RunStore(tmp_path)
    prompts = store.read("prompts", run_id="r1").to_pylist()
    assert all("<think> </think>" in p["prompt_text"] for p in prompts)
    samples = store.read("policy_samples", run_id="r1").to_pylist()
    think = [dict(s["reward_parts"])["think_format"] for s in samples]
    assert set(think) <= {0.0, 1.0} and sum(think) / len(think) > 0.5
    weights = cfg.grpo.rewards
    for s in samples:  # the reward is the weighted sum of the parts, think_format included
        parts = dict(s["reward_parts"])
        assert s["reward"] == pytest.approx(sum(weights.weight(n) * v for n, v in parts.items()))
