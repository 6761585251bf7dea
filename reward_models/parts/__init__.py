"""Reward parts, registered by name (base.py holds the contract). The built-in ones register
here, in the order their weighted scores are summed: verifier, format, then the learned ones.
A new part is one module defining its RewardPart, plus its line in BUILT_IN below (or a call
to register_reward_part from the user's own code, before the run starts)."""

from reward_models.parts import (
    answer_format,
    length,
    orm,
    overlong,
    prm,
    teacher,
    think_format,
    verifier,
)
from reward_models.parts.base import REWARD_PARTS, RewardPart, ScoringContext, register_reward_part

BUILT_IN = (
    verifier.PART,
    answer_format.PART,
    orm.PART,
    prm.PART,
    think_format.PART,
    overlong.PART,
    length.PART,
    teacher.PART,
)
for _part in BUILT_IN:
    register_reward_part(_part)

# After the built-in parts: the section's fields are read from the registry.
from reward_models.parts.weights import RewardWeights, RewardWeightsBase  # noqa: E402

__all__ = [
    "REWARD_PARTS",
    "RewardPart",
    "RewardWeights",
    "RewardWeightsBase",
    "ScoringContext",
    "register_reward_part",
]
