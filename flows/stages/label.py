"""The labelling stage of iteration k: ORM labels from the verifier; PRM labels by
Math-Shepherd Monte-Carlo completions of each step prefix, sampled from policy_k."""

from __future__ import annotations

import math

from flows.context import RunContext
from flows.names import LABEL
from flows.progress import ProgressFn, iteration_label, log
from flows.stage_results import StageResult, mean, metric_rows, row_dicts
from flows.stages.health_lines import label_balance_line
from flows.stages.train_rm import labelled_samples
from reward_models.labelling import PrmLabel, label_agreement, orm_labels, prm_labels_monte_carlo


def label_stage(ctx: RunContext, iteration: int, progress: ProgressFn) -> StageResult:
    """ORM labels from the verifier; PRM labels by Math-Shepherd Monte-Carlo completions."""
    cfg = ctx.cfg
    model, tokenizer = ctx.policy(iteration)
    samples = labelled_samples(ctx, iteration, tokenizer)
    orm_rows = orm_labels(ctx.task, samples)
    metrics = {"orm_positive_rate": mean(r.label for r in orm_rows)}
    prm_rows: list[PrmLabel] = []
    if cfg.reward_models.use_prm:
        labelled = samples[: cfg.labelling.prm_outputs]
        progress(0.1, f"Math-Shepherd labelling of {len(labelled)} outputs")
        engine = ctx.sampler("label", iteration, model, tokenizer, cfg.labelling.batch_size)
        prm_rows = prm_labels_monte_carlo(
            engine,
            tokenizer,
            ctx.task,
            labelled,
            cfg.labelling,
            seed=ctx.seed(LABEL, iteration),
        )
        metrics["prm_steps"] = float(len(prm_rows))
        agreement = label_agreement(prm_rows, mc_only=True)
        if not math.isnan(agreement):
            metrics["mc_exact_agreement"] = agreement
    where = iteration_label(iteration, cfg.run.iterations)
    log.info("%s: %s", where, label_balance_line(orm_rows, prm_rows))
    progress(0.9, f"writing {len(orm_rows)} ORM and {len(prm_rows)} PRM labels")
    with ctx.run.stage(iteration, LABEL) as attempt:
        attempt.write("orm_labels", row_dicts(orm_rows))
        if prm_rows:
            attempt.write("prm_labels", row_dicts(prm_rows))
        attempt.write("metrics", metric_rows(LABEL, metrics))
    return StageResult(LABEL, iteration, metrics=metrics)
