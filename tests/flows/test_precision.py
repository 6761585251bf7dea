"""The configured precision holds at every load: with policy.dtype bfloat16, every forward pass
of the policy in every stage (warm start, rollout, labelling, the RM stage's drift samples,
GRPO's sampling, update and reference, evaluation) runs in bfloat16, no stage keeping a
float32 copy; and the reward models, built from that bfloat16 policy, hold their own
reward_models.dtype (float32 here) in training, scoring and the drift check. With
policy.dtype bf16-mixed the policy stays float32 and the update autocasts."""

from __future__ import annotations

import collections
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from transformers import PreTrainedModel

from flows.loop import execute_run
from flows.names import POLICY
from storage.checkpoints import checkpoint_path
from storage.store import RunStore
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


def test_a_bf16_mixed_run_updates_under_autocast_and_packs_its_rm_batches(
    tmp_path: Path,
) -> None:
    """policy.dtype bf16-mixed with a reward-model token budget, against a default run: the
    policy is float32 at every load and in its checkpoints, the GRPO update's forwards run
    under autocast (sampling does not), and the reward models, trained before any autocast
    on the same policy_0 outputs, reach the default run's losses (their mini-batches packed
    into 64-token passes: same gradients, fp32 rounding over their steps)."""
    seen: collections.Counter[tuple[torch.dtype, bool]] = collections.Counter()

    def record(module: torch.nn.Module, args: object) -> None:
        if isinstance(module, PreTrainedModel) and type(module).__name__.endswith("ForCausalLM"):
            seen[module.dtype, torch.is_autocast_enabled("cpu")] += 1

    plain = micro_config(tmp_path / "plain", "plain", "run.iterations=1")
    execute_run(plain)
    mixed = micro_config(
        tmp_path / "mixed",
        "mixed",
        "run.iterations=1",
        "policy.dtype=bf16-mixed",
        "reward_models.max_tokens_per_micro_batch=64",
    )
    hook = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        execute_run(mixed)
    finally:
        hook.remove()
    assert {dtype for dtype, _ in seen} == {torch.float32}, seen
    assert seen[torch.float32, True] > 10 and seen[torch.float32, False] > 10, seen
    policy_1 = checkpoint_path(mixed.store.root, "mixed", POLICY, 1)
    weights = load_file(policy_1 / "model.safetensors")
    assert {w.dtype for w in weights.values()} == {torch.float32}
    rm_losses = [
        {
            r["name"]: r["value"]
            for r in RunStore(cfg.store.root).read("metrics", run_id=cfg.run.run_id).to_pylist()
            if r["stage"] == "train_rm" and "loss" in r["name"]
        }
        for cfg in (plain, mixed)
    ]
    assert rm_losses[0] and rm_losses[1].keys() == rm_losses[0].keys()
    for name, want in rm_losses[0].items():
        assert rm_losses[1][name] == pytest.approx(want, rel=1e-4), name
