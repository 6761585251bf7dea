"""The loop's own invariants (paper section 4.2, iterative RL): the GRPO stage of iteration k
starts from policy_k, uses policy_k as its reference (the reference is reset every iteration,
not kept at policy_0), and scores with RM_k, the reward models trained on policy_k's samples.

The stage's reference, starting policy and reward models are captured where the stage hands
them over (the policy updater, the rewarder) during a micro run, and their weights compared
with the checkpoints the run committed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file
from torch import Tensor

import flows.stages.grpo_parts as grpo_parts
from flows.loop import execute_run
from flows.names import POLICY
from reward_models.models import RewardModel
from storage.checkpoints import checkpoint_path
from tests.flow_helpers import micro_config

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]
RUN_ID = "invariants"


def weights(module: torch.nn.Module) -> dict[str, Tensor]:
    return {name: t.detach().clone() for name, t in module.state_dict().items()}


def same(got: dict[str, Tensor], saved: dict[str, Tensor]) -> bool:
    """Every saved tensor equal to the module's (a checkpoint omits tied copies)."""
    return all(torch.equal(got[name], tensor) for name, tensor in saved.items())


def test_grpo_of_iteration_k_resets_its_reference_to_policy_k_and_scores_with_rm_k(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    updaters: list[dict[str, Any]] = []
    rewarders: list[dict[str, dict[str, Tensor]]] = []
    build_updater, rewarder_class = grpo_parts.build_policy_updater, grpo_parts.GRPORewarder

    def spy_updater(*args: Any, **kwargs: Any) -> Any:
        _, _, _, model, reference, policy_dir, *_ = args
        updaters.append(
            {"start": weights(model), "reference": weights(reference), "dir": policy_dir}
        )
        return build_updater(*args, **kwargs)

    def spy_rewarder(*args: Any, **kwargs: Any) -> Any:
        reward_models: dict[str, RewardModel] = args[4]
        rewarders.append({kind: weights(rm) for kind, rm in reward_models.items()})
        return rewarder_class(*args, **kwargs)

    monkeypatch.setattr(grpo_parts, "build_policy_updater", spy_updater)
    monkeypatch.setattr(grpo_parts, "GRPORewarder", spy_rewarder)
    store = tmp_path / "store"
    cfg = micro_config(
        store, RUN_ID, "grpo.steps=2", "reward_models.use_prm=true", "grpo.rewards.prm=0.5"
    )
    assert cfg.grpo.algo.beta > 0  # a reference is loaded at all
    execute_run(cfg)

    iterations = cfg.run.iterations
    assert iterations >= 2 and len(updaters) == len(rewarders) == iterations
    policies = [
        load_file(str(checkpoint_path(store, RUN_ID, POLICY, k) / "model.safetensors"))
        for k in range(iterations + 1)
    ]
    rms = [
        {
            kind: weights(RewardModel.load(checkpoint_path(store, RUN_ID, kind, k)))
            for kind in rewarders[0]
        }
        for k in range(iterations)
    ]
    assert set(rewarders[0]) == {"orm", "prm"}
    for k in range(iterations):
        assert updaters[k]["dir"] == checkpoint_path(store, RUN_ID, POLICY, k)
        assert same(updaters[k]["start"], policies[k]), f"GRPO {k} did not start from policy_{k}"
        assert same(updaters[k]["reference"], policies[k]), f"GRPO {k}: reference is not policy_{k}"
        for kind, got in rewarders[k].items():
            assert same(got, rms[k][kind]), f"GRPO {k}: {kind} is not {kind}_{k}"
    # the comparisons can tell the iterations apart: each GRPO stage changed the policy and
    # each iteration retrained the reward models
    for k in range(1, iterations):
        assert not same(updaters[k]["reference"], policies[0])
        assert not same(updaters[k]["reference"], policies[k - 1])
        for kind, got in rewarders[k].items():
            assert not same(got, rms[k - 1][kind])
