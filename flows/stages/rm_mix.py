"""The training mix of each reward model at iteration k: the labels of k plus a replay of
earlier ones (docs/algorithm.md section 7), as examples for a pointwise RM or as pair groups
for a pairwise ORM (section 13), read from the store and encoded as the RM reads text."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from flows.context import RunContext
from flows.names import ORM, TRAIN_RM
from reward_models.config import RMKind
from reward_models.labelling import OrmLabel, PrmLabel
from reward_models.models import RewardModel
from reward_models.objectives import PAIRWISE
from reward_models.pairwise import PairGroup, TrainingMix, pair_counts, pair_groups, replay_cut
from reward_models.training import (
    RMExample,
    SampleText,
    Source,
    check_training_mix,
    orm_examples,
    prm_examples,
)
from storage.replay import replay_count, replay_sample


def sample_texts_of(ctx: RunContext, iteration: int) -> dict[tuple[str, int], SampleText]:
    """The prompt and completion text of each committed rollout of `iteration`, by
    (problem_id, sample_index): what every reward model re-reads in its own tokens."""
    rows = ctx.store.read("rollouts", run_id=ctx.run_id, iterations=[iteration]).to_pylist()
    return {
        (r["problem_id"], r["sample_index"]): SampleText(r["prompt_text"], r["completion"])
        for r in rows
    }


def training_mix(ctx: RunContext, kind: RMKind, iteration: int, model: RewardModel) -> TrainingMix:
    """What `kind` trains on at `iteration`, for its objective (reward_models.<kind>.objective)."""
    if ctx.cfg.reward_models.settings(kind).objective == PAIRWISE.name:
        return pair_mix(ctx, iteration, model)
    return label_mix(ctx, kind, iteration, model)


def read_outputs(mix: TrainingMix) -> list[RMExample]:
    """Every example the mix reads: its examples, or the outputs of its pair groups."""
    return [e for item in mix for e in (item.outputs if isinstance(item, PairGroup) else [item])]


def label_mix(ctx: RunContext, kind: RMKind, iteration: int, model: RewardModel) -> list[RMExample]:
    """New labels of `iteration` plus a replay sample of earlier ones (replay_ratio of the mix),
    encoded as `model` reads them."""
    rm_cfg = ctx.cfg.reward_models
    table = "orm_labels" if kind == ORM else "prm_labels"
    new = ctx.store.read(table, run_id=ctx.run_id, iterations=[iteration]).to_pylist()
    replay: list[dict[str, Any]] = []
    if iteration > 0 and rm_cfg.replay_ratio > 0:
        replay = replay_sample(
            ctx.store,
            table=table,
            run_id=ctx.run_id,
            before_iteration=iteration,
            n_new=len(new),
            ratio=rm_cfg.replay_ratio,
            seed=ctx.seed(TRAIN_RM, kind, iteration),
        ).to_pylist()
    by_origin: dict[tuple[Source, int], list[Mapping[str, Any]]] = {}
    for source, rows in (("new", new), ("replay", replay)):
        for row in rows:
            by_origin.setdefault((source, int(row["iteration"])), []).append(row)  # type: ignore[arg-type]
    encoder = model.encoder
    examples: list[RMExample] = []
    for (source, origin), rows in sorted(by_origin.items()):
        texts = sample_texts_of(ctx, origin)
        if kind == ORM:
            labels = [OrmLabel.from_row(r) for r in rows]
            examples += orm_examples(labels, texts, encoder, source, origin)
        else:
            steps = [PrmLabel.from_row(r) for r in rows]
            examples += prm_examples(steps, texts, encoder, rm_cfg.prm_label, source, origin)
    check_training_mix(examples, iteration)  # new from k, replay from before k only
    return examples


def pair_mix(ctx: RunContext, iteration: int, model: RewardModel) -> list[PairGroup]:
    """The pair groups of `iteration`'s ORM labels plus a replay of earlier iterations' pairs,
    replay_ratio of the mix's pairs: round(ratio / (1 - ratio) * new pairs), capped by what
    history holds, taken by replay_cut (whole groups in a seeded order, the last one cut)."""
    rm_cfg, run_id = ctx.cfg.reward_models, ctx.run_id
    encoder = model.encoder
    rows = ctx.store.read("orm_labels", run_id=run_id, iterations=[iteration]).to_pylist()
    new = [OrmLabel.from_row(r) for r in rows]
    groups = pair_groups(new, sample_texts_of(ctx, iteration), encoder, "new", iteration)
    if iteration > 0 and rm_cfg.replay_ratio > 0:
        earlier = ctx.store.read("orm_labels", run_id=run_id, iterations=range(iteration))
        history: dict[int, list[OrmLabel]] = {}
        for r in earlier.to_pylist():
            history.setdefault(int(r["iteration"]), []).append(OrmLabel.from_row(r))
        available = {
            (origin, problem): n
            for origin, labels in history.items()
            for problem, n in pair_counts(labels).items()
        }
        new_pairs = sum(len(g.pairs) for g in groups)
        wanted = replay_count(new_pairs, rm_cfg.replay_ratio, sum(available.values()))
        cut = replay_cut(available, wanted, ctx.seed(TRAIN_RM, ORM, iteration))
        for origin in sorted(history):
            kept = {problem: n for (o, problem), n in cut.items() if o == origin}
            if kept:
                texts = sample_texts_of(ctx, origin)
                groups += pair_groups(history[origin], texts, encoder, "replay", origin, kept)
    check_training_mix(read_outputs(groups), iteration)  # new from k, replay from before k only
    return groups
