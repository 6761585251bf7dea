"""Named settings of the GRPO stage (`grpo.preset`): DeepSeekMath's unified paradigm, where
SFT, RFT, Online RFT and GRPO differ only in data source, reward and gradient coefficient
(paper section 5.2.1), the paper / Dr. GRPO / DAPO variants of the GRPO update, and PPO
with a critic.

A preset fills the fields it names that are still at their defaults; a field given another
value (in YAML, `--set` or the Prefect form) keeps it, so `--set grpo.preset=rft
--set grpo.algo.lr=1e-5` is RFT at that learning rate.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from grpo_core.algo.config import GRPO_PRESETS

GRPO_STAGE_PRESETS: dict[str, dict[str, Any]] = {
    # the GRPO update of the paper and two later variants (grpo_core/algo/config.py)
    "paper": {"algo": GRPO_PRESETS["paper"]},
    "dr_grpo": {"algo": GRPO_PRESETS["dr_grpo"]},
    # DAPO adds its overlong penalty to the reward (reward_models/parts/overlong.py)
    "dapo": {"algo": GRPO_PRESETS["dapo"], "rewards": {"overlong": 1.0}},
    # PPO with a critic and GAE, the algorithm GRPO drops the critic of (online samples)
    "ppo": {"algo": GRPO_PRESETS["ppo"]},
    # the unified paradigm: SFT trains on gold solutions with coefficient 1 ...
    "sft": {"data_source": "gold", "algo": {"adv_estimator": "sft", "beta": 0.0}},
    # ... RFT on the correct ones of policy_0's samples, Online RFT of the current policy's
    "rft": {"data_source": "policy_0", "algo": {"adv_estimator": "rft", "beta": 0.0}},
    "online_rft": {"data_source": "online", "algo": {"adv_estimator": "online_rft", "beta": 0.0}},
    # ... and GRPO on group-normalised rewards: outcome (one per output) or process (PRM steps)
    "grpo_os": {"data_source": "online", "algo": {"adv_estimator": "grpo_outcome"}},
    "grpo_ps": {
        "data_source": "online",
        "algo": {"adv_estimator": "grpo_process"},
        "rewards": {"verifier": 0.0, "orm": 0.0},  # the PRM's step rewards alone
    },
}


def apply_preset(
    given: dict[str, Any], preset: dict[str, Any], defaults: dict[str, Any]
) -> dict[str, Any]:
    """`given` with each field `preset` names set to the preset's value unless `given` holds a
    value other than its default there (an explicit choice wins)."""
    merged = dict(given)
    for key, value in preset.items():
        if isinstance(value, dict):
            inner: Any = merged.get(key)
            if isinstance(inner, BaseModel):  # a section given as a model, not a mapping
                inner = inner.model_dump()
            merged[key] = apply_preset(
                inner if isinstance(inner, dict) else {}, value, defaults.get(key, {})
            )
        elif key not in merged or merged[key] == defaults.get(key):
            merged[key] = value
    return merged
