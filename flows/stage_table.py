"""The built-in stages, registered with what they declare (flows/stage_registry.py says what
each declaration means), in the order of an iteration. The config imports this table to check
`run.stages`, so it sits below the config and the stage modules: each stage's function is named
by its path (imported on first use), and a needs function gets the run's config untyped."""

from __future__ import annotations

from typing import Any

from flows.names import (
    CRITIC,
    EVALUATE,
    GRPO,
    LABEL,
    ORM,
    POLICY,
    POLICY_LORA,
    PRM,
    ROLLOUT,
    TRAIN_RM,
    WARM_START,
)
from flows.stage_registry import (
    STAGES,
    Checkpoint,
    Needs,
    Stage,
    StageFn,
    StageSpec,
    check_iteration_stages,
    covers,
    iteration_stages_schema,
    register_stage,
    stage_plan,
    unmet_need,
)
from flows.stage_results import StageResult
from reward_models.parts import REWARD_PARTS

# Config keys. Every stage of an iteration reads how the run samples (rollout.*), rewards
# (reward_models.*) and trains (grpo.*): a stage reads the outputs of those before it, so a
# change there changes them all. Not the warm start: it builds (or loads) policy_0 and
# evaluates it, so ablation arms that differ only in the iterations share it (flows/fork.py).
_ITERATION_KEYS = ("grpo.", "reward_models.", "rollout.")
# How the GRPO stage trains: the stages after it read the merged policy it stores.
_LORA_KEYS = ("grpo.lora.",)
# Where each RM starts, its format and tokens, and how RMs train: train_rm alone (the GRPO
# stage loads the stored RM_k, whose own files say what it is).
_RM_TRAINING_KEYS = (
    "reward_models.orm.",
    "reward_models.prm.",
    *(
        f"reward_models.{name}"
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
    ),
)
_POLICY_K: Checkpoint = (POLICY, 0)


def _samples_policy_k(cfg: Any) -> Needs:
    return Needs(checkpoints=frozenset({_POLICY_K}))


def _label_needs(cfg: Any) -> Needs:
    """policy_k (Math-Shepherd completions) and the rollouts it labels."""
    return Needs(checkpoints=frozenset({_POLICY_K}), tables=frozenset({"prompts", "rollouts"}))


def _train_rm_needs(cfg: Any) -> Needs:
    """policy_k (its fresh outputs measure the drift) and, for each RM it trains, the labels
    of its iteration and the rollouts they label (a frozen RM is its source)."""
    rms = cfg.reward_models
    trained = [kind for kind in (ORM, PRM) if rms.uses(kind) and rms.settings(kind).train]
    why: dict[Checkpoint | str, str] = {
        f"{kind}_labels": f"reward_models.{kind}.train" for kind in trained
    }
    labels = {f"{kind}_labels" for kind in trained}
    tables = frozenset({*labels, "rollouts"} if labels else ())
    return Needs(checkpoints=frozenset({_POLICY_K}), tables=tables, why=why)


def _grpo_needs(cfg: Any) -> Needs:
    """policy_k, and RM_k of each kind its scored reward parts, its estimator or its critic read
    (what reward_models/grpo_reward.py's models_needed and flows/stages/critic.py load)."""
    rewards, algo = cfg.grpo.rewards, cfg.grpo.algo
    why: dict[Checkpoint | str, str] = {}
    for name, part in REWARD_PARTS.items():
        weight = rewards.weight(name)
        for kind in sorted(part.needs) if part.always or weight > 0 else []:
            why.setdefault((kind, 0), f"grpo.rewards.{name} = {weight}")
    if algo.process_supervision:
        why.setdefault((PRM, 0), f"grpo.algo.adv_estimator = {algo.adv_estimator}")
    if algo.estimator.needs_values and algo.ppo.critic_init == ORM:
        why.setdefault((ORM, 0), "grpo.algo.ppo.critic_init = orm")
    rms = frozenset(key for key in why if isinstance(key, tuple))
    return Needs(checkpoints=rms | {_POLICY_K}, why=why)


def _evaluates_policy_k_plus_1(cfg: Any) -> Needs:
    return Needs(checkpoints=frozenset({(POLICY, 1)}))


register_stage(
    StageSpec(
        WARM_START,
        "flows.stages.warm_start:warm_start_stage",
        "policy_0: SFT on gold solutions (run.warm_start), saved and evaluated",
        commits=frozenset({"eval", "eval_problems", "metrics"}),
        # and the sampler's batch: its evaluation samples in batches of rollout.batch_size
        reads=("warm_start.", "evaluation.", "rollout.batch_size"),
        writes=((POLICY, 0),),
        once=True,
        changes_iteration_table=True,
    )
)
register_stage(
    StageSpec(
        ROLLOUT,
        "flows.stages.rollout:rollout_stage",
        "G samples per train prompt from policy_k, the raw material of the RM labels",
        commits=frozenset({"prompts", "rollouts", "metrics"}),
        reads=_ITERATION_KEYS,
        ignores=_LORA_KEYS + _RM_TRAINING_KEYS,
        needs=_samples_policy_k,
    )
)
register_stage(
    StageSpec(
        LABEL,
        "flows.stages.label:label_stage",
        "ORM labels from the verifier, PRM labels by Math-Shepherd completions",
        commits=frozenset({"orm_labels", "prm_labels", "metrics"}),
        reads=(*_ITERATION_KEYS, "labelling."),
        ignores=_LORA_KEYS + _RM_TRAINING_KEYS,
        needs=_label_needs,
    )
)
register_stage(
    StageSpec(
        TRAIN_RM,
        "flows.stages.train_rm:train_rm_stage",
        "RM_k: continual training on new and replayed labels, and its drift from RM_k-1",
        commits=frozenset({"rm_train", "eval", "metrics"}),
        reads=_ITERATION_KEYS,
        ignores=_LORA_KEYS,
        # iteration 0 trains RM_0 whatever retrain says; only later ones keep RM_0 instead
        # (without this, Fig. 6's two arms would share no iteration: flows/fork.py)
        reads_from={"reward_models.retrain": 1},
        writes=((ORM, 0), (PRM, 0)),
        needs=_train_rm_needs,
        changes_iteration_table=True,
    )
)
register_stage(
    StageSpec(
        GRPO,
        "flows.stages.grpo:grpo_stage",
        "policy_k+1: GRPO steps from policy_k, rewarded by the verifier and RM_k",
        commits=frozenset({"policy_samples", "metrics", "problem_pass_rates"}),
        reads=_ITERATION_KEYS,
        ignores=_RM_TRAINING_KEYS,
        writes=((POLICY, 1), (POLICY_LORA, 1), (CRITIC, 1)),
        needs=_grpo_needs,
        metrics_per_step=True,
    )
)
register_stage(
    StageSpec(
        EVALUATE,
        "flows.stages.evaluate:evaluate_stage",
        "policy_k+1 on held-out prompts: greedy accuracy, Pass@K, Maj@K",
        commits=frozenset({"eval", "eval_problems"}),
        reads=(*_ITERATION_KEYS, "evaluation."),
        ignores=_LORA_KEYS + _RM_TRAINING_KEYS,
        needs=_evaluates_policy_k_plus_1,
        policy_offset=1,
        changes_iteration_table=True,
    )
)

# What the rest of flows reads of the registry, imported from here so that the built-in stages
# are registered whenever it is read.
__all__ = [
    "STAGES",
    "Stage",
    "StageFn",
    "StageResult",
    "StageSpec",
    "check_iteration_stages",
    "covers",
    "iteration_stages_schema",
    "stage_plan",
    "unmet_need",
]
