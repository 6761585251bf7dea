"""Named settings of the GRPO stage (`grpo.preset`) and the one function that applies them:
DeepSeekMath's unified paradigm, where SFT, RFT, Online RFT and GRPO differ only in data
source, reward and gradient coefficient (paper section 5.2.1), the paper / Dr. GRPO / DAPO
variants of the GRPO update, PPO with a critic, and DPO on the policy's own pairs.

A preset is a partial tree of the `grpo` section. It fills the fields the user did not set
(in YAML or its `base:` chain, `--set`, a run's parameters) and only those: a field the user
set keeps its value even when that is the default, so `--set grpo.preset=dapo
--set grpo.algo.dynamic_sampling=false` is DAPO without dynamic sampling.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from grpo_core.algo.config import merge_trees
from grpo_core.contracts.registry import Registry


@dataclass(frozen=True)
class GRPOPreset:
    """A registered preset: the partial `grpo` tree it sets, and one line for the field's
    description."""

    settings: dict[str, Any]
    summary: str


GRPO_PRESETS: Registry[GRPOPreset] = Registry("GRPO preset")


def register_grpo_preset(name: str, summary: str, **settings: Any) -> GRPOPreset:
    """Register preset `name`: `settings` are the `grpo` fields it sets (sections as dicts)."""
    return GRPO_PRESETS.add(name, GRPOPreset(settings, summary))


# The GRPO update of DeepSeekMath section 4 (the field defaults, named) and two later variants.
# Not the paper's learning rate (1e-6, the default): it belongs to the model a config trains.
register_grpo_preset(
    "paper",
    "the paper's GRPO update: beta 0.04, clip 0.2, per-sequence length mean",
    algo={
        "beta": 0.04,
        "eps_low": 0.2,
        "eps_high": 0.2,
        "loss_agg": "seq-mean-token-mean",
        "adv_estimator": "grpo_outcome",
        "mu": 1,
    },
)
# Dr. GRPO (Liu et al. 2025): no std division, constant length normaliser.
register_grpo_preset(
    "dr_grpo",
    "Dr. GRPO: no std division, token sums over a constant length",
    algo={"adv_estimator": "dr_grpo", "loss_agg": "seq-mean-token-sum-norm"},
)
# DAPO (Yu et al. 2025): clip-higher, token-level mean, no KL term, dynamic sampling, truncated
# outputs left out of the loss, and its overlong penalty (reward_models/parts/overlong.py).
register_grpo_preset(
    "dapo",
    "DAPO: clip-higher, token-level loss, dynamic sampling, overlong penalty",
    algo={
        "eps_high": 0.28,
        "loss_agg": "token-mean",
        "beta": 0.0,
        "dynamic_sampling": True,
        "mask_truncated": True,
    },
    rewards={"overlong": 1.0},
)
# PPO with a critic (the seeds' baseline): GAE advantages, the KL penalty in the reward
# (grpo.algo.ppo.kl_coef) instead of the loss, token-level loss as verl and OpenRLHF.
register_grpo_preset(
    "ppo",
    "PPO with a critic and GAE",
    algo={"adv_estimator": "ppo", "beta": 0.0, "loss_agg": "token-mean"},
)
# The unified paradigm: SFT trains on gold solutions with coefficient 1 ...
register_grpo_preset(
    "sft",
    "gold solutions, coefficient 1",
    data_source="gold",
    algo={"adv_estimator": "sft", "beta": 0.0},
)
# ... RFT on the correct ones of policy_0's samples, Online RFT on the current policy's ...
register_grpo_preset(
    "rft",
    "correct samples of policy_0",
    data_source="policy_0",
    algo={"adv_estimator": "rft", "beta": 0.0},
)
register_grpo_preset(
    "online_rft",
    "correct samples of the current policy",
    data_source="online",
    algo={"adv_estimator": "online_rft", "beta": 0.0},
)
# ... and GRPO on group-normalised rewards: outcome (one per output) or process (PRM steps).
register_grpo_preset(
    "grpo_os",
    "GRPO with outcome rewards",
    data_source="online",
    algo={"adv_estimator": "grpo_outcome"},
)
register_grpo_preset(
    "grpo_ps",
    "GRPO with the PRM's step rewards alone",
    data_source="online",
    algo={"adv_estimator": "grpo_process"},
    rewards={"verifier": 0.0, "orm": 0.0},
)

# DPO (Rafailov et al. 2023) on pairs built each step from the current policy's groups, a right
# and a wrong output of one prompt (docs/algorithm.md section 12); pi_ref is policy_k, reset
# each iteration as for GRPO, and sits in DPO's loss itself, so the loss has no KL term.
register_grpo_preset(
    "dpo",
    "iterative DPO: pairs of a right and a wrong output of the current policy",
    data_source="online",
    algo={"adv_estimator": "dpo", "beta": 0.0},
)

# Offline DPO on the stored pairs of grpo.pairs_file (a JSONL the user names beside it).
register_grpo_preset(
    "offline_dpo",
    "offline DPO on the preference pairs of grpo.pairs_file",
    data_source="pairs_file",
    group_size=2,
    algo={"adv_estimator": "dpo_file", "beta": 0.0},
)


def apply_preset(grpo: dict[str, Any]) -> dict[str, Any]:
    """A raw `grpo` tree (its keys are the fields set) with the fields of the preset it names
    that it does not set. A section given as a model holds the fields set on it."""
    name = grpo.get("preset")
    if not isinstance(name, str) or name not in GRPO_PRESETS:  # an unknown name: the field's check
        return grpo
    return _filled(grpo, GRPO_PRESETS[name].settings)


def layers_merged(layers: list[dict[str, Any]]) -> dict[str, Any]:
    """Config trees merged in order, a later one's fields winning (a `base:` file, the file
    on it, the `--set` overrides, a run's parameters), with the preset named last filling the
    fields that neither its own layer nor a later one sets: a preset overrides what the
    layers before it set, as naming those fields there would."""
    named = [i for i, layer in enumerate(layers) if "preset" in _grpo_of(layer)]
    at = named[-1] if named else len(layers)
    before, after = _merged(layers[:at]), _merged(layers[at:])
    grpo = _grpo_of(after)
    return merge_trees(before, {**after, "grpo": apply_preset(grpo)} if grpo else after)


def _grpo_of(tree: dict[str, Any]) -> dict[str, Any]:
    grpo = tree.get("grpo")
    return grpo if isinstance(grpo, dict) else {}


def _merged(layers: list[dict[str, Any]]) -> dict[str, Any]:
    return functools.reduce(merge_trees, layers, {})


def _filled(given: dict[str, Any], preset: dict[str, Any]) -> dict[str, Any]:
    merged = dict(given)
    for key, value in preset.items():
        mine = merged.get(key)
        if isinstance(mine, BaseModel):
            mine = mine.model_dump(exclude_unset=True)
        if key not in merged:
            merged[key] = copy.deepcopy(value)  # the registry's own tree stays as registered
        elif isinstance(value, dict) and isinstance(mine, dict):
            merged[key] = _filled(mine, value)
    return merged
