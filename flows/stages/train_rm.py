"""The reward-model stage of iteration k: continual training and the drift measurement.

RM_k is trained on labels of policy_k's outputs (plus a replay of earlier labels; the mix of
its objective: flows/stages/rm_mix.py) and rewards the GRPO stage that moves policy_k to
policy_{k+1}. Why retrain at all: the policy's outputs move away from what RM_{k-1} was
trained on. So on fresh outputs of policy_k, never trained on, the stage stores RM_k's ranking
quality (`orm_auroc`, `orm_pair_accuracy`, `prm_step_auroc`) beside RM_{k-1}'s,
the RM you would have without retraining (`orm_auroc_stale`, `prm_step_auroc_stale`): for
the train-split questions GRPO rewards and, separately, for unseen test-split questions.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.context import RunContext
from flows.engines.train_engines import build_rm_engine
from flows.guards import (
    FIXES_NO_SIGNAL,
    NOT_JUDGED_INFO,
    RM_AUROC,
    RM_LABELS,
    GuardChecks,
    auroc_finding,
    label_balance_finding,
)
from flows.model_io import save_reward_model
from flows.names import EVAL_SPLIT, ORM, POLICY, PRM, TRAIN_RM, TRAIN_SPLIT
from flows.progress import ProgressFn, iteration_label, log
from flows.stage_results import StageResult, metric_rows, row_dicts
from flows.stages.health_lines import STALE, auroc_line
from flows.stages.rm_mix import read_outputs, training_mix
from grpo_core.contracts.numerics import require_finite
from grpo_core.contracts.progress import rounded
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.data.tasks.base import Problem, Split, Task
from reward_models.config import ORM_SOURCE, POLICY_SOURCE, RewardModelConfig, RMKind
from reward_models.evaluate import (
    EvalRow,
    best_of_n_rows,
    orm_eval_rows,
    orm_pair_rows,
    prm_eval_rows,
)
from reward_models.labelling import LabelledSample
from reward_models.models import RewardModel, load_or_init_reward_model
from reward_models.objectives import PAIRWISE
from reward_models.pairwise import TrainingMix
from reward_models.scoring import score_outcome, score_steps
from reward_models.training import train_reward_model

RM_EVAL = "rm_eval"  # seed namespace of the drift measurement's samples


def labelled_samples(
    ctx: RunContext, iteration: int, tokenizer: PreTrainedTokenizerBase
) -> list[LabelledSample]:
    """The committed rollouts of `iteration` with their problems, in a stable order."""
    store, run_id = ctx.store, ctx.run_id
    problems = {
        r["problem_id"]: Problem(r["problem_id"], r["question"], r["answer"])
        for r in store.read("prompts", run_id=run_id, iterations=[iteration]).to_pylist()
    }
    rows = store.read("rollouts", run_id=run_id, iterations=[iteration]).to_pylist()
    rows.sort(key=lambda r: (r["problem_id"], r["sample_index"]))
    return [
        LabelledSample(
            problem=problems[r["problem_id"]],
            prompt_text=r["prompt_text"],
            completion=r["completion"],
            completion_ids=list(tokenizer(r["completion"], add_special_tokens=False)["input_ids"]),
            sample_index=r["sample_index"],
        )
        for r in rows
    ]


def load_rm(ctx: RunContext, kind: str, k: int) -> RewardModel:
    """RM_k of `kind` on the run's device."""
    dtype = ctx.cfg.reward_models.dtype
    return RewardModel.load(ctx.require_checkpoint(kind, k), device=ctx.device, dtype=dtype)


def _initial_source(ctx: RunContext, kind: RMKind, iteration: int) -> str:
    """The directory RM_0 of `kind` starts from: the policy's, the ORM's or its own."""
    source = ctx.cfg.reward_models.settings(kind).source
    if source == POLICY_SOURCE:
        return str(ctx.checkpoint(POLICY, iteration))
    if source == ORM_SOURCE:
        return str(ctx.require_checkpoint(ORM, iteration))
    return source


def _check_label_balance(
    checks: GuardChecks, kind: RMKind, iteration: int, mix: TrainingMix, pairwise: bool
) -> None:
    """The rm_labels guard on the mix `kind` is about to train on (a soft label counts as
    correct from 0.5; a pairwise ORM's: the outputs its pairs read): one class, or too few of
    the rarer one, is nothing to learn from, and no pair is nothing to rank."""
    targets = [t for e in read_outputs(mix) for t in e.targets]
    correct = sum(t >= 0.5 for t in targets)
    minority = checks.guards.min_minority_labels
    finding = label_balance_finding(kind, correct, len(targets), iteration, minority)
    if pairwise and not mix:
        finding = (
            f"ORM training data of iteration {iteration} has no pair: no prompt's outputs were "
            "both right and wrong, and a pairwise ORM learns only from such pairs. Fixes: "
            f"reward_models.orm.objective: pointwise, or {FIXES_NO_SIGNAL}"
        )
    checks.check(RM_LABELS, finding, kind)


def _train_one(
    ctx: RunContext, kind: RMKind, iteration: int, checks: GuardChecks
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """RM_k = continue-train(RM_{k-1}) (or its source at k = 0), saved; metrics and rows.
    A frozen RM (train: false) is its source, saved untrained. The rm_labels guard sees the
    training mix first."""
    rm_cfg = ctx.cfg.reward_models
    settings = rm_cfg.settings(kind)
    prev = ctx.checkpoint(kind, iteration - 1) if iteration > 0 else None
    seed = ctx.seed(rm_cfg.seed, TRAIN_RM, kind, iteration)
    start = _initial_source(ctx, kind, iteration) if prev is None else None
    model = load_or_init_reward_model(prev, start, kind, settings, seed=seed, dtype=rm_cfg.dtype)
    model.to(ctx.device)
    if not settings.train:
        save_reward_model(ctx.checkpoint(kind, iteration), model)
        log.info("%s_%d: reward_models.%s.train is false, kept its source", kind, iteration, kind)
        return {}, []
    mix = training_mix(ctx, kind, iteration, model)
    pairwise = settings.objective == PAIRWISE.name
    _check_label_balance(checks, kind, iteration, mix, pairwise)
    rm_cfg = rm_cfg.model_copy(
        update={"epochs": rm_cfg.epochs_of(kind, continued=prev is not None)}
    )
    engines = ctx.cfg.engines
    if engines.train_workers == "ray" and engines.workers.reward_models:
        from flows.engines.train_workers import train_reward_model_on_ranks

        # continual training starts from RM_{k-1} as stored: the ranks read its checkpoint
        start_dir = prev if prev is not None else ctx.checkpoint(f"{kind}-ranks-start", iteration)
        ranks = ctx.training_ranks()
        metrics, records, weights = train_reward_model_on_ranks(
            ranks,
            engines,
            ctx.threads,
            ctx.cfg.cluster.ray_address,
            model,
            mix,
            rm_cfg,
            seed,
            start_dir,
            saved=prev is not None,
        )
    else:
        engine = build_rm_engine(engines, rm_cfg, model)
        metrics, records = train_reward_model(model, mix, rm_cfg, seed, engine=engine)
        weights = engine.full_state_dict()
    save_reward_model(ctx.checkpoint(kind, iteration), model, weights)
    log.info("%s_%d: %s", kind, iteration, rounded(metrics))
    return metrics, row_dicts(records)


def train_rm_stage(ctx: RunContext, iteration: int, progress: ProgressFn) -> StageResult:
    """Continual RM training on new + replayed labels (or, with reward_models.retrain false,
    RM_0 carried forward; a frozen RM is its source at every iteration), then RM_k vs RM_{k-1}
    on fresh held-out outputs of policy_k."""
    rm_cfg = ctx.cfg.reward_models
    both: tuple[RMKind, ...] = (ORM, PRM)
    kinds = [kind for kind in both if rm_cfg.uses(kind)]
    # policy_k: its samples measure the drift.
    model, tokenizer = ctx.policy(iteration)
    metrics: dict[str, float] = {}
    trained: list[dict[str, Any]] = []
    checks = GuardChecks(ctx.cfg.guards, ctx.run_id)
    for n, kind in enumerate(kinds):
        if iteration == 0 or (rm_cfg.retrain and rm_cfg.settings(kind).train):
            progress(0.8 * n / len(kinds), f"training the {kind.upper()}")
            kind_metrics, rows = _train_one(ctx, kind, iteration, checks)
            metrics.update({f"{kind}_{name}": value for name, value in kind_metrics.items()})
            trained += rows
        else:  # retrain false (the control) or a frozen RM: RM_0 rewards every iteration
            kept = load_rm(ctx, kind, 0)
            save_reward_model(ctx.checkpoint(kind, iteration), kept)
            log.info("%s_%d: not retrained, kept %s_0", kind, iteration, kind)
    eval_rows: list[dict[str, Any]] = []
    if kinds:
        progress(0.8, "measuring RM drift on fresh held-out outputs")
        eval_rows = rm_drift_rows(ctx, iteration, model, tokenizer)
        where = iteration_label(iteration, ctx.cfg.run.iterations)
        log.info("%s: %s", where, auroc_line(eval_rows))
        metrics.update(auroc_metrics(eval_rows))
        _check_auroc(checks, iteration, eval_rows, kinds)
    metrics.update(checks.metrics)
    progress(1.0, f"writing {len(trained)} rm_train rows")
    with ctx.run.stage(iteration, TRAIN_RM) as attempt:
        if checks.not_judged:
            attempt.info[NOT_JUDGED_INFO] = checks.not_judged
        if trained:
            attempt.write("rm_train", trained)
        if eval_rows:
            attempt.write("eval", eval_rows)
        attempt.write("metrics", metric_rows(TRAIN_RM, metrics))
    return StageResult(TRAIN_RM, iteration, metrics=metrics, warnings=checks.warnings)


def auroc_metrics(eval_rows: list[dict[str, Any]]) -> dict[str, float]:
    """The AUROC eval rows as stage metrics: `orm_auroc` etc. on the questions GRPO rewards
    (train split), `orm_auroc_test` etc. on new questions."""
    out = {}
    for row in eval_rows:
        metric = str(row["metric"])
        if "auroc" in metric:
            suffix = "" if row["split"] == TRAIN_SPLIT else f"_{row['split']}"
            out[metric + suffix] = float(row["value"])
    return out


def _check_auroc(
    checks: GuardChecks, iteration: int, eval_rows: list[dict[str, Any]], kinds: list[RMKind]
) -> None:
    """The rm_auroc guard on RM_k's ranking of fresh outputs of the questions GRPO rewards, for
    each RM the run uses (an AUROC undefined there, with outputs all right or all wrong, has no
    row: the guard cannot judge it)."""
    floor = checks.guards.rm_auroc_floor
    measured = {
        str(row["metric"]): float(row["value"]) for row in eval_rows if row["split"] == TRAIN_SPLIT
    }
    for kind in kinds:
        metric = "orm_auroc" if kind == ORM else "prm_step_auroc"
        finding = auroc_finding(metric, measured.get(metric), floor, iteration)
        checks.check(RM_AUROC, finding, kind)


def _fresh_outputs(
    ctx: RunContext,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    k: int,
    split: Split,
) -> tuple[list[Problem], list[str], RolloutBatch]:
    """Prompts of `split` and fresh outputs of policy_k, sampled as the GRPO stage samples them
    (own seeds: never the rollouts the reward models trained on)."""
    cfg = ctx.cfg
    rm_cfg, g = cfg.reward_models, cfg.grpo
    # The test split keeps the seed namespace it had before the train split was measured too.
    purpose = RM_EVAL if split == EVAL_SPLIT else f"{RM_EVAL}-{split}"
    seed = ctx.seed(purpose, k)
    problems = ctx.task.problems(split, rm_cfg.eval_prompts, seed=cfg.run.seed)
    prompter = ctx.prompter(tokenizer)
    prompts = [prompter(p.question) for p in problems]
    batch_size = cfg.rollout.batch_size
    engine = ctx.sampler("evaluate", k, model, tokenizer, batch_size, purpose)
    params = SamplingParams(max_new_tokens=g.max_new_tokens, temperature=g.algo.temperature)
    return problems, prompts, engine.generate(prompts, rm_cfg.eval_samples, params, seed=seed)


def rm_drift_rows(
    ctx: RunContext, k: int, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase
) -> list[dict[str, Any]]:
    """Eval rows (policy_iteration = k) of RM_k and, for k >= 1, RM_{k-1} ('_stale' metrics)
    on fresh outputs of policy_k (`model`), once per split: `train`, the questions GRPO
    draws its prompts from (what the RMs reward), and `test`, questions no stage trains on
    (how far the RMs' checking carries to new questions)."""
    models: dict[tuple[RMKind, int], RewardModel] = {}

    def rm(kind: RMKind, iteration: int) -> RewardModel:
        if (kind, iteration) not in models:
            models[kind, iteration] = load_rm(ctx, kind, iteration)
        return models[kind, iteration]

    rm_cfg = ctx.cfg.reward_models
    rows: list[EvalRow] = []
    for split in (TRAIN_SPLIT, EVAL_SPLIT):
        problems, prompts, sampled = _fresh_outputs(ctx, model, tokenizer, k, split)
        rows += _split_rows(rm_cfg, ctx.task, k, split, problems, prompts, sampled, rm)
    return [{"policy_iteration": k, **dataclasses.asdict(r)} for r in rows]


def _require_finite_scores(what: str, scores: torch.Tensor | list[float], split: str) -> None:
    """A reward model's scores of fresh outputs are finite before any AUROC is stored."""
    where = f"the drift measurement on {split}-split outputs"
    cause = "the reward model diverged (lower reward_models.lr) or its checkpoint is damaged"
    require_finite(what, scores, where=where, cause=cause)


def _split_rows(
    rm_cfg: RewardModelConfig,
    task: Task,
    k: int,
    split: str,
    problems: list[Problem],
    prompts: list[str],
    sampled: RolloutBatch,
    rm: Callable[[RMKind, int], RewardModel],
) -> list[EvalRow]:
    """RM_k's (and RM_{k-1}'s) ranking of one split's fresh outputs against the verifier and,
    for the PRM, against the task's exact step labels."""
    owners = [problems[i] for i in sampled.prompt_index]
    questions = [p.question for p in owners]  # uncertainty is over questions, drawn with repeats
    prompt_questions = [p.question for p in problems]
    row_prompts = [prompts[i] for i in sampled.prompt_index]
    correct = [float(task.is_correct(p, t)) for p, t in zip(owners, sampled.texts, strict=True)]
    shape = (len(problems), rm_cfg.eval_samples)
    # Exact step labels, on outputs whose steps the task can check (the PRM's yardstick).
    exact = [task.step_labels(p, t) for p, t in zip(owners, sampled.texts, strict=True)]
    rows: list[EvalRow] = []
    measured = [(k, "")] + ([(k - 1, STALE)] if k > 0 else [])
    for rm_iteration, suffix in measured:
        found: list[EvalRow] = []
        if rm_cfg.use_orm:
            orm = rm(ORM, rm_iteration)
            probs = score_outcome(orm, row_prompts, sampled.texts)
            _require_finite_scores(f"ORM_{rm_iteration}'s scores", probs, split)
            found += orm_eval_rows(probs.numpy(), correct, split, questions)
            found += orm_pair_rows(probs.numpy(), correct, split, questions)
            if not suffix:
                found += best_of_n_rows(
                    probs.reshape(shape).numpy(),
                    torch.tensor(correct).reshape(shape).numpy(),
                    split,
                    prompt_questions,
                )
        if rm_cfg.use_prm:
            prm = rm(PRM, rm_iteration)
            scored = score_steps(prm, row_prompts, sampled.texts)
            flat = [x for scores in scored.scores for x in scores]
            _require_finite_scores(f"PRM_{rm_iteration}'s step scores", flat, split)
            checked = [
                (s, [float(x) for x in y], q)
                for s, y, q in zip(scored.scores, exact, questions, strict=True)
                if s and y is not None and len(y) == len(s)
            ]
            if checked:
                step_scores, step_labels, of = zip(*checked, strict=True)
                found += prm_eval_rows(list(step_scores), list(step_labels), split, list(of))
        rows += [dataclasses.replace(r, metric=r.metric + suffix) for r in found]
    return rows
