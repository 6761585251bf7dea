"""Stage functions `stage(cfg, run, iteration, progress) -> StageResult`.

Each stage reads its inputs from the store and checkpoints, calls the component libraries,
writes its rows inside one stage attempt and commits. A stage that crashes leaves nothing
visible; checkpoints it wrote are overwritten by the rerun. The GRPO stage is in
`flows/grpo_stage.py`, which shares `policy_at`/`save_model` from here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping
from typing import Any, Final

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.common import (
    EVALUATE,
    LABEL,
    ORM,
    POLICY,
    PRM,
    ROLLOUT,
    TRAIN_RM,
    WARM_START,
    ProgressFn,
    StageResult,
    ckpt,
    derive_seed,
    log,
    metric_rows,
    require_checkpoint,
    resolve_device,
)
from flows.config import ItergrpoConfig
from flows.engines import build_rm_engine, build_rollout_engine, trained_weights
from flows.grpo_stage import grpo_stage
from flows.model_io import policy_at, save_model, save_reward_model, to_device
from flows.sharding import sharded_engine
from grpo_core.answers import extract_answer
from grpo_core.evaluate import evaluate_policy_with_samples
from grpo_core.policy import build_policy, format_prompt, load_policy
from grpo_core.rollout_types import RolloutBatch, SamplingParams
from grpo_core.tasks.base import Problem, Task
from grpo_core.tasks.registry import make_task
from grpo_core.warm_start import warm_start
from reward_models.evaluate import best_of_n_rows, orm_eval_rows, prm_eval_rows
from reward_models.labelling import (
    LabelledSample,
    OrmLabel,
    PrmLabel,
    label_agreement,
    orm_labels,
    prm_labels_monte_carlo,
)
from reward_models.models import RewardModel, RMKind
from reward_models.scoring import score_outcome, score_steps
from reward_models.training import (
    RMExample,
    Source,
    load_or_init_reward_model,
    orm_examples,
    prm_examples,
    sample_texts,
    train_reward_model,
)
from storage.replay import replay_sample
from storage.store import RunWriter

__all__ = [
    "evaluate_stage",
    "grpo_stage",
    "label_stage",
    "rollout_stage",
    "train_rm_stage",
    "warm_start_stage",
]

EVAL_SPLIT: Final = "test"


def _evaluate(
    cfg: ItergrpoConfig,
    run: RunWriter,
    task: Task,
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    policy_iteration: int,
    rm_iteration: int | None,
) -> list[dict[str, Any]]:
    """Eval rows of policy_{policy_iteration}; with rm_iteration, also of that iteration's RMs
    on the same fresh held-out samples (the policy they will reward next)."""
    problems = task.problems(EVAL_SPLIT, cfg.evaluation.n_prompts, seed=cfg.run.seed)
    # With cluster.ray_address: Ray shards that load policy_{policy_iteration} from the store.
    engine = sharded_engine(
        cfg, run.run_id, policy_iteration, model, cfg.rollout.batch_size, EVALUATE
    ) or build_rollout_engine(
        cfg, run, policy_iteration, "evaluate", model, tokenizer, cfg.rollout.batch_size
    )
    metrics, sampled, problems = evaluate_policy_with_samples(
        engine,
        tokenizer,
        task,
        problems,
        cfg.evaluation,
        seed=derive_seed(cfg.run.seed, EVALUATE, policy_iteration),
    )
    rows = [{"split": EVAL_SPLIT, **dataclasses.asdict(m)} for m in metrics]
    if rm_iteration is not None:
        rows += _rm_eval_rows(cfg, run, task, tokenizer, problems, sampled, rm_iteration)
    return [{"policy_iteration": policy_iteration, **row} for row in rows]


def _rm_eval_rows(
    cfg: ItergrpoConfig,
    run: RunWriter,
    task: Task,
    tokenizer: PreTrainedTokenizerBase,
    problems: list[Problem],
    sampled: RolloutBatch,
    k: int,
) -> list[dict[str, Any]]:
    prompts = [format_prompt(tokenizer, problems[i].question) for i in sampled.prompt_index]
    owners = [problems[i] for i in sampled.prompt_index]
    correct = [float(task.is_correct(p, t)) for p, t in zip(owners, sampled.texts, strict=True)]
    shape = (len(problems), cfg.evaluation.n_samples)
    rows = []
    if cfg.reward_models.use_orm:
        orm = _load_rm(cfg, run, ORM, k)
        probs = score_outcome(orm, orm.tokenizer, prompts, sampled.texts)
        rows += orm_eval_rows(probs.numpy(), correct, EVAL_SPLIT)
        rows += best_of_n_rows(
            probs.reshape(shape).numpy(), torch.tensor(correct).reshape(shape).numpy(), EVAL_SPLIT
        )
    if cfg.reward_models.use_prm:
        prm = _load_rm(cfg, run, PRM, k)
        scored = score_steps(prm, prm.tokenizer, prompts, sampled.texts)
        # Step accuracy against exact labels, on outputs whose steps the task can check.
        pairs = [
            (s, [float(x) for x in exact])
            for s, p, t in zip(scored.scores, owners, sampled.texts, strict=True)
            if s and (exact := task.step_labels(p, t)) is not None and len(exact) == len(s)
        ]
        if pairs:
            rows += prm_eval_rows([s for s, _ in pairs], [y for _, y in pairs], EVAL_SPLIT)
    return [dataclasses.asdict(r) for r in rows]


def _load_rm(cfg: ItergrpoConfig, run: RunWriter, kind: str, k: int) -> RewardModel:
    path = require_checkpoint(ckpt(cfg, run.run_id, kind, k), f"{kind}_{k}")
    return RewardModel.load(path, device=resolve_device(cfg))


def warm_start_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """policy_0: the initial policy, SFT-warm-started on gold solutions, and its evaluation."""
    task = make_task(cfg.task)
    torch.manual_seed(derive_seed(cfg.run.seed, WARM_START))
    model, tokenizer = build_policy(cfg.policy)
    to_device(model, cfg)
    metrics: dict[str, float] = {}
    if cfg.run.warm_start:
        progress(0.0, "warm start (SFT)")
        ws = cfg.warm_start.model_copy(update={"seed": derive_seed(cfg.run.seed, WARM_START)})
        metrics = {k: float(v) for k, v in warm_start(model, tokenizer, task, ws).items()}
    save_model(ckpt(cfg, run.run_id, POLICY, 0), model, tokenizer)
    progress(0.8, "evaluating policy_0")
    rows = _evaluate(cfg, run, task, model, tokenizer, policy_iteration=0, rm_iteration=None)
    with run.stage(iteration, WARM_START) as attempt:
        attempt.write("eval", rows)
        attempt.write("metrics", metric_rows(WARM_START, metrics))
    return StageResult(WARM_START, iteration, metrics=metrics)


def rollout_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """G samples per train prompt from policy_k: the raw material of the RM labels."""
    task = make_task(cfg.task)
    model, tokenizer = policy_at(cfg, run, iteration)
    seed = derive_seed(cfg.run.seed, ROLLOUT, iteration)
    problems = task.problems("train", cfg.rollout.prompts, seed=seed)
    prompts = [format_prompt(tokenizer, p.question) for p in problems]
    params = SamplingParams(
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
    )
    engine = sharded_engine(
        cfg, run.run_id, iteration, model, cfg.rollout.batch_size, ROLLOUT
    ) or build_rollout_engine(
        cfg, run, iteration, "rollout", model, tokenizer, cfg.rollout.batch_size
    )
    batch = engine.generate(prompts, cfg.rollout.group_size, params, seed=seed)
    progress(0.9, f"writing {len(batch)} rollouts")
    # Relative to the store root, so a moved or copied store still resolves it.
    policy_dir = str(ckpt(cfg, run.run_id, POLICY, iteration).relative_to(run.store.root))
    rollouts = []
    for r, text in enumerate(batch.texts):
        i = batch.prompt_index[r]
        rollouts.append(
            {
                "problem_id": problems[i].problem_id,
                "sample_index": r % cfg.rollout.group_size,
                "prompt_text": prompts[i],
                "completion": text,
                "n_prompt_tokens": len(batch.prompt_ids[r]),
                "n_completion_tokens": len(batch.completion_ids[r]),
                "finish_reason": batch.finish_reasons[r],
                "temperature": params.temperature,
                "top_p": params.top_p,
                "seed": seed,
                "policy_checkpoint": policy_dir,
                "correct": task.is_correct(problems[i], text),
                "extracted_answer": extract_answer(text),
            }
        )
    accuracy = _mean(r["correct"] for r in rollouts)
    prompt_rows = [
        {
            "problem_id": p.problem_id,
            "split": "train",
            "question": p.question,
            "answer": p.answer,
            "prompt_text": text,
        }
        for p, text in zip(problems, prompts, strict=True)
    ]
    with run.stage(iteration, ROLLOUT) as attempt:
        attempt.write("prompts", prompt_rows)
        attempt.write("rollouts", rollouts)
        attempt.write("metrics", metric_rows(ROLLOUT, {"accuracy": accuracy}))
    return StageResult(ROLLOUT, iteration, metrics={"accuracy": accuracy})


def _labelled_samples(
    run: RunWriter, iteration: int, tokenizer: PreTrainedTokenizerBase
) -> list[LabelledSample]:
    """The committed rollouts of `iteration` with their problems, in a stable order."""
    store = run.store
    problems = {
        r["problem_id"]: Problem(r["problem_id"], r["question"], r["answer"])
        for r in store.read("prompts", run_id=run.run_id, iterations=[iteration]).to_pylist()
    }
    rows = store.read("rollouts", run_id=run.run_id, iterations=[iteration]).to_pylist()
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


def label_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """ORM labels from the verifier; PRM labels by Math-Shepherd Monte-Carlo completions."""
    task = make_task(cfg.task)
    model, tokenizer = policy_at(cfg, run, iteration)
    samples = _labelled_samples(run, iteration, tokenizer)
    orm_rows = orm_labels(task, samples)
    metrics = {"orm_positive_rate": _mean(r.label for r in orm_rows)}
    prm_rows: list[PrmLabel] = []
    if cfg.reward_models.use_prm:
        progress(0.1, f"Math-Shepherd labelling of {len(samples)} outputs")
        engine = sharded_engine(
            cfg, run.run_id, iteration, model, cfg.labelling.batch_size, LABEL
        ) or build_rollout_engine(
            cfg, run, iteration, "label", model, tokenizer, cfg.labelling.batch_size
        )
        prm_rows = prm_labels_monte_carlo(
            engine,
            tokenizer,
            task,
            samples,
            cfg.labelling,
            seed=derive_seed(cfg.run.seed, LABEL, iteration),
        )
        metrics["prm_steps"] = float(len(prm_rows))
        agreement = label_agreement(prm_rows, mc_only=True)
        if not math.isnan(agreement):
            metrics["mc_exact_agreement"] = agreement
    progress(0.9, f"writing {len(orm_rows)} ORM and {len(prm_rows)} PRM labels")
    with run.stage(iteration, LABEL) as attempt:
        attempt.write("orm_labels", [dataclasses.asdict(r) for r in orm_rows])
        if prm_rows:
            attempt.write("prm_labels", [dataclasses.asdict(r) for r in prm_rows])
        attempt.write("metrics", metric_rows(LABEL, metrics))
    return StageResult(LABEL, iteration, metrics=metrics)


def eval_summary(rows: list[dict[str, Any]]) -> dict[str, float]:
    """One value per metric: scalar ones as they are, K-metrics at the largest K ('maj@8')."""
    top_k = max((int(r["k"]) for r in rows if r.get("k") is not None), default=None)
    summary: dict[str, float] = {}
    for r in rows:
        if r.get("k") is None:
            summary[r["metric"]] = float(r["value"])
        elif int(r["k"]) == top_k:
            summary[str(r["metric"]).replace("@k", f"@{top_k}")] = float(r["value"])
    return summary


def _mean(values: Iterable[Any]) -> float:
    vals = [float(v) for v in values]
    return sum(vals) / len(vals) if vals else math.nan


def _rm_examples(
    cfg: ItergrpoConfig,
    run: RunWriter,
    kind: str,
    iteration: int,
    tokenizer: PreTrainedTokenizerBase,
) -> list[RMExample]:
    """New labels of `iteration` plus a replay sample of earlier ones (replay_ratio of the mix)."""
    table = "orm_labels" if kind == ORM else "prm_labels"
    new = run.store.read(table, run_id=run.run_id, iterations=[iteration]).to_pylist()
    replay: list[dict[str, Any]] = []
    if iteration > 0 and cfg.reward_models.replay_ratio > 0:
        replay = replay_sample(
            run.store,
            table=table,
            run_id=run.run_id,
            before_iteration=iteration,
            n_new=len(new),
            ratio=cfg.reward_models.replay_ratio,
            seed=derive_seed(cfg.run.seed, TRAIN_RM, kind, iteration),
        ).to_pylist()
    by_origin: dict[tuple[Source, int], list[Mapping[str, Any]]] = {}
    for source, rows in (("new", new), ("replay", replay)):
        for row in rows:
            by_origin.setdefault((source, int(row["iteration"])), []).append(row)  # type: ignore[arg-type]
    examples: list[RMExample] = []
    for (source, origin), rows in sorted(by_origin.items()):
        texts = sample_texts(_labelled_samples(run, origin, tokenizer))
        if kind == ORM:
            labels = [OrmLabel.from_row(r) for r in rows]
            examples += orm_examples(labels, texts, tokenizer, source, origin)
        else:
            steps = [PrmLabel.from_row(r) for r in rows]
            examples += prm_examples(
                steps, texts, tokenizer, cfg.reward_models.prm_label, source, origin
            )
    return examples


def train_rm_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """Continual RM training: rm_{k-1} (or the backbone at k = 0) on new + replayed labels."""
    rm_cfg = cfg.reward_models
    wanted: list[tuple[RMKind, bool]] = [(ORM, rm_cfg.use_orm), (PRM, rm_cfg.use_prm)]
    kinds = [kind for kind, on in wanted if on]
    policy_dir = require_checkpoint(ckpt(cfg, run.run_id, POLICY, iteration), f"policy_{iteration}")
    _, tokenizer = load_policy(policy_dir)
    backbone = str(rm_cfg.init_path) if rm_cfg.init == "path" else str(policy_dir)
    metrics: dict[str, float] = {}
    trained: list[dict[str, Any]] = []
    for n, kind in enumerate(kinds):
        progress(n / max(len(kinds), 1), f"training the {kind.upper()}")
        examples = _rm_examples(cfg, run, kind, iteration, tokenizer)
        prev = ckpt(cfg, run.run_id, kind, iteration - 1) if iteration > 0 else None
        seed = derive_seed(cfg.run.seed, rm_cfg.seed, TRAIN_RM, kind, iteration)
        model = load_or_init_reward_model(prev, backbone, kind, tokenizer, seed)
        model.to(resolve_device(cfg))
        engine = build_rm_engine(cfg, model)
        kind_metrics, records = train_reward_model(model, examples, rm_cfg, seed, engine=engine)
        metrics.update({f"{kind}_{name}": value for name, value in kind_metrics.items()})
        trained += [dataclasses.asdict(r) for r in records]
        save_reward_model(ckpt(cfg, run.run_id, kind, iteration), model, trained_weights(engine))
        log.info("%s_%d: %s", kind, iteration, kind_metrics)
    progress(1.0, f"writing {len(trained)} rm_train rows")
    with run.stage(iteration, TRAIN_RM) as attempt:
        if trained:
            attempt.write("rm_train", trained)
        attempt.write("metrics", metric_rows(TRAIN_RM, metrics))
    return StageResult(TRAIN_RM, iteration, metrics=metrics)


def evaluate_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """policy_{k+1} on held-out prompts; rm_k on the same fresh samples (AUROC, best-of-N)."""
    task = make_task(cfg.task)
    model, tokenizer = policy_at(cfg, run, iteration + 1)
    rm_iteration = iteration if (cfg.reward_models.use_orm or cfg.reward_models.use_prm) else None
    rows = _evaluate(cfg, run, task, model, tokenizer, iteration + 1, rm_iteration)
    progress(0.9, f"writing {len(rows)} eval rows")
    with run.stage(iteration, EVALUATE) as attempt:
        attempt.write("eval", rows)
    metrics = eval_summary(rows)
    log.info("policy_%d: %s", iteration + 1, {k: round(v, 4) for k, v in metrics.items()})
    return StageResult(EVALUATE, iteration, metrics=metrics)
