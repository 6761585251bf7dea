"""policy.attn_implementation holds at every load of a run: with eager, every forward pass of
the policy in every stage (warm start, rollout, labelling, GRPO's sampling, update and
reference, evaluation) and of the PPO critic built from it runs eager attention, though no
checkpoint records the setting; and the run stores what the default kernels' run stores (the
same tokens, rewards within float rounding)."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from flows.loop import execute_run
from grpo_core.model.critic import ValueModel
from storage.store import RunStore
from tests.flow_helpers import micro_config, snapshot

pytestmark = pytest.mark.slow


@pytest.mark.fresh_warm_start  # the warm start trains here, with the kernels asked for
def test_an_eager_ppo_run_computes_every_policy_and_critic_forward_with_eager(
    tmp_path: Path,
) -> None:
    ppo = ("run.iterations=1", "grpo.preset=ppo")
    execute_run(micro_config(tmp_path, "default", *ppo))
    seen: collections.Counter[tuple[str, str]] = collections.Counter()

    def record(module: torch.nn.Module, args: object) -> None:
        if isinstance(module, PreTrainedModel) and type(module).__name__.endswith("ForCausalLM"):
            seen["policy", module.config._attn_implementation] += 1
        elif isinstance(module, ValueModel):
            seen["critic", module.net.config._attn_implementation] += 1

    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        execute_run(micro_config(tmp_path, "eager", *ppo, "policy.attn_implementation=eager"))
    finally:
        hook.remove()
    assert {kernel for _, kernel in seen} == {"eager"}, seen
    assert seen["policy", "eager"] > 100  # sampling, updates and the reference all ran
    assert seen["critic", "eager"] > 0
    default, eager = (snapshot(RunStore(tmp_path), run) for run in ("default", "eager"))
    assert strip_checkpoints(eager["rollouts"]) == strip_checkpoints(default["rollouts"])
    assert eager["eval"] == default["eval"]
    for plain, other in zip(default["policy_samples"], eager["policy_samples"], strict=True):
        assert other["completion"] == plain["completion"]
        assert other["reward"] == pytest.approx(plain["reward"], abs=1e-4)


def strip_checkpoints(rows: list[dict[str, object]]) -> list[dict[str, object]]:
    """Rows less the checkpoint path they name (each run has its own)."""
    return [{k: v for k, v in row.items() if k != "policy_checkpoint"} for row in rows]
