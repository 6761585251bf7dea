"""Which stages read which config keys: the rule for rerunning a run with a corrected field.

A run that failed in a stage may be rerun with a field changed, without --force-config, when
no committed stage read that field: the stages that did commit would have computed the same
with the new value, so the run still equals a clean run with the new config. A key listed
here is read only by the stages named; every other key counts as read by every stage (the
safe default: a field not listed here refuses the rerun once anything is committed).
`guards.*` is read by no stage's outputs: a guard only decides whether a stage may commit.
"""

from __future__ import annotations

from flows.names import EVALUATE, GRPO, ITERATION_STAGES, LABEL, TRAIN_RM, WARM_START

# The warm start builds (or loads) policy_0 and evaluates it: it reads policy, task, prompt,
# run, engines, cluster, warm_start, evaluation and the sampler's rollout.batch_size, never
# how the iterations roll out, label, train RMs or run GRPO (flows/stages/warm_start.py). So
# ablation arms that differ only there share the evaluation of policy_0 (flows/fork.py).
_ITERATIONS = frozenset(ITERATION_STAGES)

# Dotted key (a section ends with ".") -> the stages that read it. The most specific wins.
_READ_ONLY_BY: dict[str, frozenset[str]] = {
    "guards.": frozenset(),
    "grpo.": _ITERATIONS,
    "reward_models.": _ITERATIONS,
    "rollout.": _ITERATIONS,
    "rollout.batch_size": frozenset({WARM_START, *ITERATION_STAGES}),  # every sampler's batch
    "warm_start.": frozenset({WARM_START}),
    "labelling.": frozenset({LABEL}),
    "evaluation.": frozenset({WARM_START, EVALUATE}),  # warm_start evaluates policy_0
    # how the GRPO stage trains; the stages after it read the merged policy it stores
    "grpo.lora.": frozenset({GRPO}),
    # where each RM starts, its format and tokens, and how RMs train: train_rm alone (the GRPO
    # stage loads the stored RM_k, whose own files say what it is)
    "reward_models.orm.": frozenset({TRAIN_RM}),
    "reward_models.prm.": frozenset({TRAIN_RM}),
    **{
        f"reward_models.{name}": frozenset({TRAIN_RM})
        for name in (
            "lr",
            "epochs",
            "continual_epochs",
            "prm_epochs",
            "prm_continual_epochs",
            "batch_size",
            "prm_label",
            "replay_ratio",
            "seed",
            "retrain",
            "eval_prompts",
            "eval_samples",
        )
    },
}


# Keys its readers ignore before an iteration: train_rm of iteration 0 trains RM_0 whatever
# `retrain` says (flows/stages/train_rm.py); only later iterations keep RM_0 instead. The
# rerun rule does not need this (a committed train_rm of iteration 0 refuses the change, the
# safe side); a fork does (flows/fork.py): without it, Fig. 6's two arms share no iteration.
_FIRST_ITERATION_READ: dict[str, int] = {"reward_models.retrain": 1}


def first_iteration_reading(key: str) -> int:
    """The first iteration whose stages (of `stages_reading(key)`) read `key`: 0 for most."""
    return _FIRST_ITERATION_READ.get(key, 0)


def stages_reading(key: str) -> frozenset[str] | None:
    """The stages that read config key `key` (dotted), None for every stage."""
    matches = [p for p in _READ_ONLY_BY if key == p or (p.endswith(".") and key.startswith(p))]
    return _READ_ONLY_BY[max(matches, key=len)] if matches else None
