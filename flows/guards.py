"""Guards on what the loop learns from, checked every iteration (docs/guards.md).

A run on data the project did not make can go wrong without a word: reward models trained on
one class, an RM that ranks below chance, a learned reward that pays for wrong answers, GRPO
steps with no outcome signal. Each guard is a pure check (a finding, None, or NotJudged when
the stage gave it too little to judge) plus an action field in `guards`: `stop` raises
GuardTripped before the stage commits (the run is resumable once the cause is fixed), `warn`
logs the finding and records it, `off` skips the check. Every check that judges stores a
metric `guard_<name>` (1 tripped, 0 passed) with its stage; one that cannot stores no verdict,
logs why and records the reason in the stage's commit info (`guards_not_judged`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from flows.progress import log
from grpo_core.contracts.errors import UserError

GuardAction = Literal["stop", "warn", "off"]
ACTION_HELP = "stop (no commit; resumable after the fix), warn (log and record) or off"

# The key of a stage's commit info naming each guard that could not judge, and why.
NOT_JUDGED_INFO = "guards_not_judged"

RM_LABELS = "rm_labels"
RM_AUROC = "rm_auroc"
OVER_OPTIMISATION = "over_optimisation"
EQUAL_REWARDS = "equal_rewards"

# What a user can change when the policy gives the reward models nothing to learn from.
FIXES_NO_SIGNAL = (
    "warm-start the policy on gold solutions (run.warm_start: true, more warm_start.steps), "
    "start from a stronger policy, use an easier task, or reward with the verifier alone "
    "(grpo.rewards: {verifier: 1.0, orm: 0}, reward_models.use_orm: false and "
    "reward_models.use_prm: false)"
)


@dataclass(frozen=True)
class NotJudged:
    """A guard's check that had too little to judge (`why`): neither passed nor tripped."""

    why: str


Finding = str | NotJudged | None


class GuardTripped(UserError):
    """A guard set to `stop` found the run going wrong; the message names the cause, the
    fixes and the field that turns the guard into a warning."""


class GuardsConfig(BaseModel):
    """What each guard does when it trips, and its thresholds."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    rm_labels: GuardAction = Field(
        "stop",
        description=(
            "Reward-model training data (new labels plus replay) with one class, or fewer than "
            f"min_minority_labels of the rarer one, in the train_rm stage: {ACTION_HELP}."
        ),
    )
    min_minority_labels: int = Field(
        2,
        ge=1,
        le=1_000_000,
        description="Fewest labels of the rarer class (correct or wrong) an RM trains on (>= 1).",
    )
    rm_auroc: GuardAction = Field(
        "warn",
        description=(
            "A retrained ORM/PRM whose AUROC on fresh outputs of the questions GRPO rewards is "
            f"below rm_auroc_floor, in the train_rm stage: {ACTION_HELP}."
        ),
    )
    rm_auroc_floor: float = Field(
        0.6,
        ge=0.0,
        le=1.0,
        description="AUROC the reward models must reach on fresh outputs (0 to 1; 0.5 is chance).",
    )
    over_optimisation: GuardAction = Field(
        "warn",
        description=(
            "The learned reward paying more than the verifier's accuracy of the same outputs "
            "by over_optimisation_gap, at each of the GRPO stage's last over_optimisation_steps "
            f"steps: {ACTION_HELP}."
        ),
    )
    over_optimisation_gap: float = Field(
        0.25,
        gt=0.0,
        le=1.0,
        description="RM reward mean minus verifier accuracy that counts as over-paying (0 to 1).",
    )
    over_optimisation_steps: int = Field(
        5,
        ge=1,
        le=1_000_000,
        description="Consecutive GRPO steps over the gap that trip the guard (>= 1).",
    )
    equal_rewards: GuardAction = Field(
        "warn",
        description=(
            "A GRPO stage in which at least equal_rewards_share of the steps had every group's "
            f"outputs rewarded alike (no outcome gradient at all): {ACTION_HELP}."
        ),
    )
    equal_rewards_share: float = Field(
        0.5,
        gt=0.0,
        le=1.0,
        description="Share of a stage's steps with no reward contrast that trips the guard.",
    )


def label_balance_finding(
    kind: str, correct: int, total: int, iteration: int, min_minority: int
) -> str | None:
    """Why `total` labels with `correct` positives cannot train `kind`, None if they can."""
    what = f"{kind.upper()} training data of iteration {iteration}"
    unit = "step labels" if kind == "prm" else "labels"
    if total == 0:
        return f"{what} is empty: the rollouts gave nothing to label. Fixes: {FIXES_NO_SIGNAL}"
    minority = min(correct, total - correct)
    if minority == 0:
        value = 1 if correct else 0
        said = "every output was correct" if correct else "no output was correct"
        return (
            f"{what} has one class: all {total} {unit} are {value} ({said}); a reward model "
            f"trained on one class cannot rank outputs, and GRPO would be paid for its guesses. "
            f"Fixes: {FIXES_NO_SIGNAL}"
        )
    if minority < min_minority:
        rarer = "correct" if correct < total - correct else "wrong"
        return (
            f"{what} has only {minority} {rarer} of {total} {unit} "
            f"(guards.min_minority_labels = {min_minority}): too few to learn the difference. "
            f"Fixes: more rollouts (rollout.prompts, rollout.group_size), or {FIXES_NO_SIGNAL}"
        )
    return None


def auroc_finding(metric: str, auroc: float | None, floor: float, iteration: int) -> Finding:
    """Why RM_k's AUROC on fresh outputs (`metric`, e.g. orm_auroc) is too low, None if not;
    NotJudged when it is undefined (None: the outputs, or steps, were of one class)."""
    if auroc is None:
        graded = "outputs" if metric == "orm_auroc" else "outputs' checkable steps"
        return NotJudged(
            f"{metric} of iteration {iteration} is undefined: the fresh {graded} of the "
            "questions GRPO rewards were all right or all wrong (an AUROC needs both; more "
            "reward_models.eval_prompts or eval_samples give it both)"
        )
    if auroc >= floor:
        return None
    chance = " (below chance: it ranks wrong outputs higher)" if auroc < 0.5 else ""
    return (
        f"{metric} of iteration {iteration} is {auroc:.3f} on fresh outputs{chance}, under "
        f"guards.rm_auroc_floor = {floor}: the learned reward barely tells right from wrong. "
        "Fixes: more labels per iteration (rollout.prompts), more reward_models.epochs, a "
        "pretrained reward model (docs/reward-models.md), or more verifier weight in "
        "grpo.rewards"
    )


def over_optimisation_finding(
    rm_means: Sequence[float],
    accuracies: Sequence[float],
    gap: float,
    steps: int,
    iteration: int,
) -> Finding:
    """Why the learned reward over-pays (RM reward mean - verifier accuracy > `gap` at each of
    the last `steps` steps), None if it does not; NotJudged with fewer steps than that."""
    gaps = [m - a for m, a in zip(rm_means, accuracies, strict=True)]
    if len(gaps) < steps:
        return NotJudged(
            f"GRPO iteration {iteration} had {len(gaps)} step(s) with a learned reward, fewer "
            f"than the guards.over_optimisation_steps = {steps} the check reads (fewer "
            "over_optimisation_steps, or more grpo.steps, let it judge)"
        )
    if min(gaps[-steps:]) <= gap:
        return None
    last = gaps[-steps:]
    return (
        f"GRPO iteration {iteration}: the learned reward paid {sum(last) / steps:.2f} more than "
        f"the verifier's accuracy of the same outputs over the last {steps} steps (guards."
        f"over_optimisation_gap = {gap}): the policy is learning what the RM over-rates. "
        "Fixes: fewer grpo.steps per iteration, a larger grpo.algo.beta, more verifier weight "
        "in grpo.rewards, or retrain the RMs more often on fresh labels"
    )


def equal_rewards_finding(
    equal_group_shares: Sequence[float], share: float, iteration: int
) -> Finding:
    """Why a GRPO stage learned little: at least `share` of its steps had every group rewarded
    alike (`equal_group_shares`: each step's share of such groups), None otherwise; NotJudged
    when no step sampled a group."""
    if not equal_group_shares:
        return NotJudged(f"GRPO iteration {iteration}: no step sampled a group to compare")
    flat = sum(1 for s in equal_group_shares if s >= 1.0)
    if flat / len(equal_group_shares) < share:
        return None
    return (
        f"GRPO iteration {iteration}: {flat} of {len(equal_group_shares)} steps had every "
        "group's outputs rewarded alike, so they gave no outcome gradient. Fixes: a larger "
        "grpo.group_size, a higher grpo.algo.temperature, a task nearer the policy's level, or "
        f"the DAPO preset's dynamic sampling. Fixes for one-sided outcomes: {FIXES_NO_SIGNAL}"
    )


class GuardChecks:
    """One stage's guard checks: each finding acted on as `guards.<name>` says, the
    `guard_<name>[_<of>]` metrics (1 tripped, 0 passed; none when off or not judged), why
    each check that could not judge did not (`not_judged`, by metric name) and the warnings."""

    def __init__(self, guards: GuardsConfig, run_id: str) -> None:
        self.guards, self.run_id = guards, run_id
        self.metrics: dict[str, float] = {}
        self.not_judged: dict[str, str] = {}
        self.warnings: list[str] = []

    def check(self, name: str, finding: Finding, of: str = "") -> None:
        """Record `finding` of guard `name` (about `of`, e.g. orm); GuardTripped when set to
        stop, a warning line when set to warn; a check that could not judge stores no
        verdict and says why in a warning line, whatever its action (but off)."""
        action: GuardAction = getattr(self.guards, name)
        if action == "off":
            return
        metric = f"guard_{name}" + (f"_{of}" if of else "")
        if isinstance(finding, NotJudged):
            self.not_judged[metric] = finding.why
            log.warning("guard %s: not judged: %s", name, finding.why)
            self.warnings.append(f"{name}: not judged: {finding.why}")
            return
        self.metrics[metric] = 0.0 if finding is None else 1.0
        if finding is None:
            return
        if action == "stop":
            raise GuardTripped(
                f"{finding}. The stage committed nothing (guards.{name}: stop). Fix the cause "
                f"(`itergrpo resume {self.run_id} --set KEY=VALUE` corrects a field no "
                "committed stage read; other fixes need a new run id), or go on regardless: "
                f"`itergrpo resume {self.run_id} --set guards.{name}=warn`"
            )
        log.warning("guard %s: %s", name, finding)
        self.warnings.append(f"{name}: {finding}")
