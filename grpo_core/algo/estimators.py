"""Advantage estimators by name, each with what it needs: the inputs it reads (the weighted
reward, the verifier's verdict, PRM step rewards) and the data sources it trains on (paper
section 5.2.1's unified paradigm). grpo.algo.adv_estimator's choices, its description and the
config's checks (a PRM for step rewards, a nonzero reward weight, the data source) are read
from here.

Torch-free, so a config loads (and a run is refused) without importing torch: an estimator's
function is named by its import path ("module:function") and imported on first use.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Literal

from grpo_core.contracts.registry import Registry

if TYPE_CHECKING:
    from torch import Tensor

    from grpo_core.algo.advantages import AdvantageInputs

AdvantageEstimator = Callable[["AdvantageInputs", float], "Tensor"]
# Where a GRPO stage's outputs come from: samples of the current policy, samples of the
# warm-started policy_0, the task's gold solutions, or the preference pairs of grpo.pairs_file.
DataSource = Literal["online", "policy_0", "gold", "pairs_file"]
DATA_SOURCES: tuple[DataSource, ...] = ("online", "policy_0", "gold", "pairs_file")
SAMPLED_SOURCES: frozenset[DataSource] = frozenset({"online", "policy_0"})
# The AdvantageInputs an estimator reads besides response_mask: the weighted outcome reward,
# the verifier's verdict, or the PRM's step rewards (which need a trained PRM).
# The critic's values (PPO) are read too, and the stage then trains a critic beside the policy;
# token rewards come from the per-token reward parts (a teacher's: on-policy distillation).
AdvantageField = Literal["rewards", "correct", "step_rewards", "values", "token_rewards"]
# The reward part every GRPO step scores whatever its weight: its 1/0 is `correct`.
VERIFIER = "verifier"
# The loss an estimator's output feeds: the clipped surrogate of per-token advantages
# (sections 1-3), or DPO's on the pairs it marks (+1 chosen, -1 rejected; section 12).
PolicyLoss = Literal["clipped_surrogate", "dpo"]


@dataclass(frozen=True)
class EstimatorSpec:
    """A registered estimator: its function `(inputs, eps) -> (B, T) token advantages` (or
    the "module:function" path of it) and what it needs."""

    name: str
    impl: str | AdvantageEstimator
    reads: frozenset[AdvantageField]
    data_sources: frozenset[DataSource]
    summary: str  # one line for the config's field description
    loss: PolicyLoss = "clipped_surrogate"

    @cached_property
    def fn(self) -> AdvantageEstimator:
        """The estimator function (imported on first use when given by path)."""
        if not isinstance(self.impl, str):
            return self.impl
        module, _, name = self.impl.partition(":")
        fn: AdvantageEstimator = getattr(importlib.import_module(module), name)
        return fn

    @property
    def needs_step_rewards(self) -> bool:
        """Rewards per reasoning step (a PRM scores each step), not one per output."""
        return "step_rewards" in self.reads

    @property
    def needs_weighted_reward(self) -> bool:
        """Reads the weighted outcome reward, so at least one reward weight must be > 0."""
        return "rewards" in self.reads

    @property
    def needs_token_rewards(self) -> bool:
        """Reads a reward per response token, which a per-token reward part with a weight
        gives (reward_models/parts/teacher.py)."""
        return "token_rewards" in self.reads

    @property
    def needs_values(self) -> bool:
        """Reads a critic's values (PPO): the stage trains a value model beside the policy."""
        return "values" in self.reads

    @property
    def pairs(self) -> bool:
        """Marks preference pairs for the DPO loss instead of giving advantages."""
        return self.loss == "dpo"


ADVANTAGE_ESTIMATORS: Registry[EstimatorSpec] = Registry("advantage estimator")


def register_adv_estimator(
    name: str,
    impl: str | AdvantageEstimator,
    *,
    reads: set[AdvantageField],
    summary: str,
    data_sources: set[DataSource] | None = None,
    loss: PolicyLoss = "clipped_surrogate",
) -> EstimatorSpec:
    """Register an estimator under `name`, with the inputs it reads, the data sources it
    trains on (default: sampled outputs, the current policy's or policy_0's) and the loss
    its output feeds."""
    sources = frozenset(data_sources) if data_sources else SAMPLED_SOURCES
    spec = EstimatorSpec(name, impl, frozenset(reads), sources, summary, loss)
    return ADVANTAGE_ESTIMATORS.add(name, spec)


def get_adv_estimator(name: str) -> AdvantageEstimator:
    """The estimator function registered under `name`."""
    return ADVANTAGE_ESTIMATORS[name].fn


_FORMULAS = "grpo_core.algo.advantages"
register_adv_estimator(
    "grpo_outcome",
    f"{_FORMULAS}:grpo_outcome_estimator",
    reads={"rewards"},
    summary="paper, outcome supervision: group z-score of one reward per output",
)
register_adv_estimator(
    "grpo_process",
    f"{_FORMULAS}:grpo_process_estimator",
    reads={"step_rewards"},
    summary="paper, process supervision: z-scored PRM step rewards summed over the steps "
    "ending at or after each token; needs a PRM",
)
register_adv_estimator(
    "dr_grpo",
    f"{_FORMULAS}:dr_grpo_estimator",
    reads={"rewards"},
    summary="reward minus group mean, no std division",
)
register_adv_estimator(
    "rft",
    f"{_FORMULAS}:rft_estimator",
    reads={"correct"},
    data_sources={"policy_0"},
    summary="1 for a correct output of policy_0, 0 otherwise",
)
register_adv_estimator(
    "online_rft",
    f"{_FORMULAS}:rft_estimator",
    reads={"correct"},
    data_sources={"online"},
    summary="1 for a correct output of the current policy, 0 otherwise",
)
register_adv_estimator(
    "sft",
    f"{_FORMULAS}:sft_estimator",
    reads=set(),
    data_sources={"gold"},
    summary="1 for every gold solution",
)
register_adv_estimator(
    "ppo",
    "grpo_core.algo.ppo:ppo_estimator",
    reads={"rewards", "values"},
    data_sources={"online"},
    summary="PPO with a critic: GAE (grpo.algo.ppo.gamma, lam) on per-token rewards, the "
    "weighted reward on the last token minus the KL penalty; trains a value model",
)
register_adv_estimator(
    "dpo",
    "grpo_core.algo.dpo:dpo_estimator",
    reads={"correct"},
    loss="dpo",
    summary="DPO on pairs of a right and a wrong output of each group (the verifier's); "
    "trains with the DPO loss of grpo.algo.dpo",
)
register_adv_estimator(
    "dpo_ranked",
    "grpo_core.algo.dpo:dpo_ranked_estimator",
    reads={"rewards"},
    loss="dpo",
    summary="DPO on pairs of the best and the worst outputs of each group by the weighted "
    "reward (the ORM's ranking under the demo's weights); the DPO loss of grpo.algo.dpo",
)
register_adv_estimator(
    "dpo_file",
    "grpo_core.algo.dpo:dpo_file_estimator",
    reads=set(),
    data_sources={"pairs_file"},
    loss="dpo",
    summary="offline DPO on the stored pairs of grpo.pairs_file (chosen over rejected); the "
    "DPO loss of grpo.algo.dpo",
)
register_adv_estimator(
    "distill",
    "grpo_core.algo.distill:distill_estimator",
    reads={"token_rewards"},
    data_sources={"online"},
    summary="on-policy distillation: each sampled token's advantage is its per-token reward "
    "(grpo.rewards.teacher: the teacher's log-prob minus the student's), no group baseline, "
    "no discount",
)
