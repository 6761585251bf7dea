"""The configured precision holds at every load: with policy.dtype bfloat16, every forward pass
of the policy in every stage (warm start, rollout, labelling, the RM stage's drift samples,
GRPO's sampling, update and reference, evaluation) runs in bfloat16, no stage keeping a
float32 copy; and the reward models, built from that bfloat16 policy, hold their own
reward_models.dtype (float32 here) in training, scoring and the drift check."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from transformers import PreTrainedModel

from flows.loop import execute_run
from tests.flow_helpers import micro_config

pytestmark = pytest.mark.slow


def test_a_bfloat16_run_computes_every_policy_forward_in_bfloat16(tmp_path: Path) -> None:
    seen: collections.Counter[tuple[str, torch.dtype]] = collections.Counter()

    def record(module: torch.nn.Module, args: object) -> None:
        if isinstance(module, PreTrainedModel):  # whole models, not their layers
            seen[type(module).__name__, module.dtype] += 1

    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        dtypes = ("policy.dtype=bfloat16", "reward_models.dtype=float32", "run.iterations=1")
        cfg = micro_config(tmp_path, "bf16", *dtypes)
        execute_run(cfg)
    finally:
        hook.remove()
    policy = {dtype: n for (name, dtype), n in seen.items() if name.endswith("ForCausalLM")}
    assert policy.keys() == {torch.bfloat16}, seen
    assert sum(policy.values()) > 100  # sampling, updates and the reference all ran
    rms = {dtype: n for (name, dtype), n in seen.items() if name.endswith("ForTokenClassification")}
    assert rms.keys() == {torch.float32}, seen  # the micro run's ORM and PRM
    assert sum(rms.values()) > 10
