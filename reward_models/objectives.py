"""Reward-model training objectives, registered by name: what an RM learns from the verifier's
labels (`reward_models.<orm|prm>.objective`). Declarations are torch-free (the config reads
them when it loads); `training` names the trainer's side by import path."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_core.contracts.registry import Registry


@dataclass(frozen=True)
class RMObjective:
    """A registered objective. kinds: the reward models it can train ('orm', 'prm');
    training: import path of its ObjectiveTraining (reward_models/training.py): how its items
    are batched, how a batch's loss is formed, what is recorded (the built-in ones:
    reward_models/pointwise.py, reward_models/pairwise.py)."""

    name: str
    description: str
    kinds: frozenset[str]
    training: str


RM_OBJECTIVES: Registry[RMObjective] = Registry("reward-model objective")


def register_rm_objective(objective: RMObjective) -> RMObjective:
    """Register `objective`; `reward_models.<orm|prm>.objective` may then name it."""
    return RM_OBJECTIVES.add(objective.name, objective)


POINTWISE = register_rm_objective(
    RMObjective(
        name="pointwise",
        description="BCE of each read position's score against its label (the verifier's "
        "1/0 for an ORM, Math-Shepherd's for a PRM): the paper's reward models",
        kinds=frozenset({"orm", "prm"}),
        training="reward_models.pointwise:POINTWISE_TRAINING",
    )
)
PAIRWISE = register_rm_objective(
    RMObjective(
        name="pairwise",
        description="Bradley-Terry on pairs of one prompt's outputs: -log sigmoid(r(right) - "
        "r(wrong)) for every output the verifier passed against every one it failed "
        "(docs/algorithm.md section 13); ORM only",
        kinds=frozenset({"orm"}),
        training="reward_models.pairwise:PAIRWISE_TRAINING",
    )
)
