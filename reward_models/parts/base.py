"""The reward-part contract: a named score of every output of a GRPO step, with its default
weight, the reward models it needs loaded and its own settings. The GRPO reward is the
weighted sum of the parts (grpo_core/algo/rewards.py); `grpo.rewards.<part>` is its weight.

Declaring a part imports neither torch nor a model, so the config (which lists the parts)
stays quick to load: what a part reads comes through the ScoringContext, which runs the
reward models on first use.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from grpo_core.contracts.registry import Registry
from grpo_core.contracts.rollout import RolloutBatch
from grpo_core.data.tasks.base import Problem, Task
from reward_models.config import RMKind

if TYPE_CHECKING:
    from torch import Tensor

    from reward_models.models import RewardModel


@dataclass
class ScoringContext:
    """What the parts of one GRPO step may read; B outputs, prompt-major (row r is an output
    of the problem problems[r])."""

    task: Task
    problems: list[Problem]  # the problem of each output
    prompts: list[str]  # the formatted prompt of each output
    batch: RolloutBatch
    max_new_tokens: int  # the completion budget the outputs were sampled with
    models: Mapping[RMKind, RewardModel] = field(default_factory=dict)
    temperature: float = 1.0  # the sampling temperature of the batch's log-probs
    loaded: Mapping[str, Any] = field(default_factory=dict)  # what each part's `load` gave
    _step_scores: list[list[float]] | None = field(default=None, repr=False)

    @property
    def texts(self) -> list[str]:
        return self.batch.texts

    def model(self, need: RMKind) -> RewardModel:
        """A reward model the stage loaded for a part that declared it in `needs`."""
        if need not in self.models:
            raise ValueError(f"no {need} loaded: the reward part using it must declare it needs")
        return self.models[need]

    def outcome_scores(self, need: RMKind) -> Tensor:
        """(B,) float32: the probability the `need` reward model gives each output's answer."""
        from reward_models.scoring import score_outcome

        rm = self.model(need)
        return score_outcome(rm, self.prompts, self.texts).float().cpu()

    def step_scores(self) -> list[list[float]]:
        """The PRM's probability at each step end of each output (computed once per step)."""
        if self._step_scores is None:
            from reward_models.scoring import score_steps

            self._step_scores = score_steps(self.model("prm"), self.prompts, self.texts).scores
        return self._step_scores


# A part's scores of every output: (B,) floats, a tensor or a list, higher is better.
PartScore = Callable[[ScoringContext, Mapping[str, Any]], "Tensor | Sequence[float]"]
# A per-token part's scores: one list per output, one value per response token.
TokenScore = Callable[[ScoringContext, Mapping[str, Any]], Sequence[Sequence[float]]]
# What a part reads besides the context (a teacher model), loaded once per GRPO stage from its
# options on the stage's device: (options, device) -> the object, ScoringContext.loaded[name].
PartLoad = Callable[[Mapping[str, Any], str], Any]


@dataclass(frozen=True)
class RewardPart:
    """A registered reward part: `score(context, options)` gives every output one number, or,
    for a per-token part, `token_score` one number per response token (its weighted scores are
    the step's token rewards, which an estimator reading `token_rewards` turns into advantages;
    the output's one number is then the sum of its tokens' scores).

    needs: the reward models it reads (trained by the RM stage, loaded by the GRPO stage).
    learned: a reward model's opinion (its mean is the RM reward of the over-optimisation gap).
    always: scored and stored at weight 0 too (cheap, and worth reading beside the reward).
    options: settings of the part, fields `grpo.rewards.<name>_<option>`: (type, pydantic Field).
    load: a model of its own it reads (a teacher), loaded once per GRPO stage when it is scored.
    """

    name: str
    score: PartScore | None  # None: a per-token part (token_score)
    description: str
    default_weight: float = 0.0
    needs: frozenset[RMKind] = frozenset()
    learned: bool = False
    always: bool = False
    options: Mapping[str, tuple[Any, Any]] = field(default_factory=dict)
    token_score: TokenScore | None = None
    load: PartLoad | None = None

    def __post_init__(self) -> None:
        if (self.score is None) == (self.token_score is None):
            raise ValueError(
                f"reward part {self.name!r} needs exactly one of score (one number per "
                "output) or token_score (one per response token)"
            )

    @property
    def per_token(self) -> bool:
        """Scores each response token (its weighted scores are the step's token rewards)."""
        return self.token_score is not None

    def option_field(self, option: str) -> str:
        """The grpo.rewards field that holds `option` of this part."""
        return f"{self.name}_{option}"


REWARD_PARTS: Registry[RewardPart] = Registry("reward part")


def register_reward_part(part: RewardPart) -> RewardPart:
    """Register `part`; its weight is then `grpo.rewards.<name>` in every config."""
    return REWARD_PARTS.add(part.name, part)
