"""Reward-model training: examples from label rows, and the trainer that updates the RM by its
objective (BCE: reward_models/pointwise.py; Bradley-Terry on pairs: reward_models/pairwise.py)
and records what was seen.

Continual training (docs/algorithm.md section 7): iteration 0 starts from the RM's source, iteration
k > 0 from the k-1 reward model, on new labels plus a replay sample of earlier ones. Every
example is re-tokenized from (prompt text, completion text) by the RM's own encoder, so
replayed rows read back from the store train exactly like new ones, whatever the RM's tokenizer.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Literal, NamedTuple, TypeVar

import torch
from torch import Tensor

from grpo_core.contracts.numerics import require_finite
from grpo_core.contracts.progress import progress_bar
from grpo_core.contracts.training import OptimizerSettings, TrainEngine
from grpo_core.engines.train import TorchEngine
from grpo_core.model.checkpointing import set_gradient_checkpointing
from grpo_core.model.config import AUTOCAST_DTYPES
from reward_models.config import RewardModelConfig, RMKind
from reward_models.labelling import LabelledSample, OrmLabel, PrmLabel
from reward_models.models import RewardModel
from reward_models.objectives import RM_OBJECTIVES
from reward_models.token_budget import note_items_over_budget, token_micro_batches
from reward_models.views import RMEncoder, RMInput

log = logging.getLogger(__name__)

Source = Literal["new", "replay"]

# The trainer's optimizer settings: torch AdamW's default weight decay and clipping at 1.0.
RM_WEIGHT_DECAY = 0.01
RM_MAX_GRAD_NORM = 1.0


class SampleText(NamedTuple):
    """The text of one output: the formatted prompt and the completion."""

    prompt_text: str
    completion: str


@dataclass(frozen=True)
class RMExample:
    """One training sequence: prompt + completion ids, completion positions to read, targets.

    read_positions index completion_ids (-1 reads the last prompt token, for an empty
    completion); step_indices name the PRM steps of the targets (None for an ORM);
    source_table is the store table the labels were read from.
    """

    rm_kind: RMKind
    prompt_ids: list[int]
    completion_ids: list[int]
    read_positions: list[int]
    targets: list[float]
    problem_id: str
    sample_index: int
    step_indices: list[int] | None
    source: Source
    origin_iteration: int
    source_table: str

    def __post_init__(self) -> None:
        where = f"{self.rm_kind} example {self.problem_id}#{self.sample_index}"
        if len(self.read_positions) != len(self.targets) or not self.targets:
            raise ValueError(f"{where}: need one target per read position (and at least one)")
        if self.step_indices is not None and len(self.step_indices) != len(self.targets):
            raise ValueError(f"{where}: need one step index per target")
        if any(not (0.0 <= t <= 1.0) for t in self.targets):  # NaN fails this too
            raise ValueError(f"{where}: targets must be in [0, 1] (got {self.targets})")
        if any(not (-1 <= p < len(self.completion_ids)) for p in self.read_positions):
            raise ValueError(f"{where}: read positions {self.read_positions} out of range")
        if self.source not in ("new", "replay"):
            raise ValueError(f"{where}: source must be 'new' or 'replay' (got {self.source!r})")


@dataclass(frozen=True)
class TrainedRow:
    """A row of `rm_train`: one label the trainer fitted in one epoch."""

    rm_kind: RMKind
    problem_id: str
    sample_index: int
    step_index: int | None
    label: float
    source: Source
    origin_iteration: int
    epoch: int
    source_table: str


def sample_texts(samples: Sequence[LabelledSample]) -> dict[tuple[str, int], SampleText]:
    """Text lookup keyed (problem_id, sample_index) for the examples builders."""
    return {
        (s.problem.problem_id, s.sample_index): SampleText(s.prompt_text, s.completion)
        for s in samples
    }


def _text(texts: Mapping[tuple[str, int], SampleText], key: tuple[str, int]) -> SampleText:
    if key not in texts:
        raise KeyError(f"no prompt/completion text for label row {key[0]}#{key[1]}")
    return texts[key]


def _encodings(encoder: RMEncoder) -> Callable[[SampleText], RMInput]:
    """encoder.encode once per distinct text: a small policy repeats itself (~60% of the
    demo's outputs are copies of another), and tokenizing is Python work per character."""
    return functools.cache(lambda text: encoder.encode(*text))


def orm_examples(
    rows: Sequence[OrmLabel],
    texts: Mapping[tuple[str, int], SampleText],
    encoder: RMEncoder,
    source: Source,
    origin_iteration: int,
    source_table: str = "orm_labels",
) -> list[RMExample]:
    """One example per ORM label, read where the RM's format reads the outcome."""
    encode = _encodings(encoder)
    out = []
    for row in rows:
        read = encode(_text(texts, (row.problem_id, row.sample_index)))
        out.append(
            RMExample(
                "orm",
                read.prompt_ids,
                read.completion_ids,
                [read.outcome_position],
                [float(row.label)],
                row.problem_id,
                row.sample_index,
                None,
                source,
                origin_iteration,
                source_table,
            )
        )
    return out


def prm_examples(
    rows: Sequence[PrmLabel],
    texts: Mapping[tuple[str, int], SampleText],
    encoder: RMEncoder,
    label: Literal["hard", "soft"],
    source: Source,
    origin_iteration: int,
    source_table: str = "prm_labels",
) -> list[RMExample]:
    """One example per output holding its labelled steps, read where the RM's format reads
    each step (recomputed from the text in the RM's own tokens)."""
    grouped: dict[tuple[str, int], list[PrmLabel]] = {}
    for row in rows:
        grouped.setdefault((row.problem_id, row.sample_index), []).append(row)
    encode = _encodings(encoder)
    out = []
    for key, steps in grouped.items():
        read = encode(_text(texts, key))
        ends = read.step_positions
        steps = sorted(steps, key=lambda r: r.step_index)
        if steps[-1].step_index >= len(ends):
            raise ValueError(
                f"PRM row {key[0]}#{key[1]} step {steps[-1].step_index}: the completion has "
                f"only {len(ends)} steps"
            )
        out.append(
            RMExample(
                "prm",
                read.prompt_ids,
                read.completion_ids,
                [ends[r.step_index] for r in steps],
                [float(r.hard_label if label == "hard" else r.soft_label) for r in steps],
                key[0],
                key[1],
                [r.step_index for r in steps],
                source,
                origin_iteration,
                source_table,
            )
        )
    return out


def check_training_mix(examples: Sequence[RMExample], iteration: int) -> None:
    """New examples must come from `iteration`, replayed ones from earlier iterations only."""
    for e in examples:
        ok = (
            e.origin_iteration == iteration if e.source == "new" else e.origin_iteration < iteration
        )
        if not ok:
            raise ValueError(
                f"{e.source} example {e.problem_id}#{e.sample_index} comes from iteration "
                f"{e.origin_iteration}, not allowed in the mix of iteration {iteration}"
            )


def rm_optimizer_settings(cfg: RewardModelConfig) -> OptimizerSettings:
    """The optimizer settings of a TrainEngine (TorchEngine, DeepSpeedEngine) training an RM,
    with the forward autocast of reward_models.dtype (bf16-mixed)."""
    return OptimizerSettings(
        lr=cfg.lr,
        weight_decay=RM_WEIGHT_DECAY,
        max_grad_norm=RM_MAX_GRAD_NORM,
        autocast=AUTOCAST_DTYPES.get(cfg.dtype),
    )


Item = TypeVar("Item")


@dataclass(frozen=True)
class ObjectiveTraining(Generic[Item]):
    """How the trainer runs an objective (reward_models/objectives.py) on its items.

    batches(items, order, batch_size): one epoch's mini-batches, items taken in `order`.
    terms(batch): how many terms the batch's loss averages (read positions, pairs).
    shape(item): the sequences an item puts in a forward pass and its longest one's tokens
    (an item is never split: a pair group's pairs read each other's scores).
    loss(model, batch, pad_id, device, normaliser): the mean of the batch's terms, or with a
    normaliser their sum divided by it (a rank's share, or a token-budget micro-batch, of a
    mini-batch of that many terms).
    records(batch, epoch): the rm_train rows of what the batch read. counts(items): metrics.
    """

    check: Callable[[RewardModel, Sequence[Item], int], None]
    batches: Callable[[Sequence[Item], list[int], int], list[list[Item]]]
    terms: Callable[[Sequence[Item]], int]
    shape: Callable[[Item], tuple[int, int]]
    loss: Callable[[torch.nn.Module, Sequence[Item], int, torch.device, int | None], Tensor]
    records: Callable[[Sequence[Item], int], list[TrainedRow]]
    counts: Callable[[Sequence[Item]], dict[str, float]]


def objective_training(name: str) -> ObjectiveTraining[Any]:
    """The ObjectiveTraining of the registered objective `name` (imported on first use)."""
    module, _, attr = RM_OBJECTIVES[name].training.partition(":")
    found: ObjectiveTraining[Any] = getattr(importlib.import_module(module), attr)
    return found


def consecutive_batches(items: Sequence[Item], order: list[int], size: int) -> list[list[Item]]:
    """`size` items per mini-batch in `order` (the last one may be short)."""
    return [[items[i] for i in order[start : start + size]] for start in range(0, len(order), size)]


def _share_passes(
    share: list[Item], objective: ObjectiveTraining[Item], max_tokens: int | None
) -> list[list[Item]]:
    if not share:
        return []
    return (
        [share] if max_tokens is None else token_micro_batches(share, objective.shape, max_tokens)
    )


def _rank_passes(
    engine: TrainEngine,
    objective: ObjectiveTraining[Item],
    batch: Sequence[Item],
    max_tokens: int | None,
) -> list[tuple[list[Item], float]]:
    """This data-parallel rank's forward/backward passes over a mini-batch, with weights: its
    share (every `world`-th item from its rank on), whole or in token-budget micro-batches.
    Every rank plans every share, so all run the same number of passes (DDP and DeepSpeed
    need every rank's backward); a rank with fewer runs one item at weight 0."""
    rank, world = engine.data_parallel_rank, engine.data_parallel_size
    shares = [list(batch[r::world]) for r in range(world)]
    plans = [_share_passes(share, objective, max_tokens) for share in shares]
    passes = max(len(plan) for plan in plans)
    mine = [(part, 1.0) for part in plans[rank]]
    return mine + [(list(batch[:1]), 0.0)] * (passes - len(mine))


def _backward_mini_batch(
    engine: TrainEngine,
    objective: ObjectiveTraining[Item],
    batch: Sequence[Item],
    pad_id: int,
    max_tokens: int | None,
    check: Callable[[Tensor], None],
) -> float:
    """Accumulate the gradient of the mini-batch's mean loss (this rank's part of it); the
    loss value. One process without a budget: the mean in one pass, as ever. Otherwise each
    pass's summed loss over the mini-batch's terms, so the passes add up to the mean."""
    model, device = engine.forward_model, engine.device
    if engine.data_parallel_size == 1 and max_tokens is None:
        with engine.forward_context():
            loss = objective.loss(model, batch, pad_id, device, None)
        check(loss)
        engine.backward(loss)
        return loss.item()
    n_terms = objective.terms(batch)
    total = 0.0
    for part, weight in _rank_passes(engine, objective, batch, max_tokens):
        with engine.forward_context():
            loss = objective.loss(model, part, pad_id, device, n_terms) * weight
        check(loss)
        engine.backward(loss)
        total += loss.item()
    return total


def train_reward_model(
    model: RewardModel,
    examples: Sequence[Item],
    cfg: RewardModelConfig,
    seed: int,
    progress: bool = True,
    engine: TrainEngine | None = None,
) -> tuple[dict[str, float], list[TrainedRow]]:
    """Training by the RM's objective (cfg.<kind>.objective: BCE on RMExamples, Bradley-Terry
    on the PairGroups of reward_models/pairwise.py) in seeded shuffled mini-batches; metrics
    and the rows seen.

    Each mini-batch is one step of `engine`, which wraps `model`: by default a TorchEngine
    (AdamW, settings from rm_optimizer_settings); a DeepSpeedEngine built on `model` with the
    same settings trains the same way. With engine.data_parallel_size > 1 (training ranks)
    every rank passes the same items and seed, runs its share of each mini-batch, and returns
    the same metrics and records. The records list one row per target (per output read, for
    pairs) per epoch, in the order the trainer used them.
    """
    objective = objective_training(cfg.settings(model.kind).objective)
    objective.check(model, examples, cfg.max_length)
    if cfg.max_tokens_per_micro_batch is not None:
        note_items_over_budget(examples, objective.shape, cfg.max_tokens_per_micro_batch)
    pad_id = model.tokenizer.pad_token_id
    if engine is None:
        engine = TorchEngine(model, rm_optimizer_settings(cfg))
    generator = torch.Generator().manual_seed(seed)
    epochs = [
        objective.batches(
            examples, torch.randperm(len(examples), generator=generator).tolist(), cfg.batch_size
        )
        for _ in range(cfg.epochs)
    ]
    records: list[TrainedRow] = []
    epoch_losses: list[float] = []
    engine.zero_grad()
    engine.train()
    set_gradient_checkpointing(engine.model, cfg.gradient_checkpointing)
    steps = sum(len(batches) for batches in epochs)
    bar = progress_bar(steps, f"train {model.kind}", "batch", enabled=progress)
    try:
        for epoch, batches in enumerate(epochs):
            loss_sum, count = 0.0, 0
            for b, batch in enumerate(batches):
                n_terms = objective.terms(batch)
                check = functools.partial(
                    require_finite,
                    f"{model.kind.upper()} training loss",
                    where=f"epoch {epoch}, batch {b}",
                    cause="lower reward_models.lr, or a corrupt RM checkpoint",
                )
                loss = _backward_mini_batch(
                    engine, objective, batch, pad_id, cfg.max_tokens_per_micro_batch, check
                )
                engine.step()  # clip to RM_MAX_GRAD_NORM, AdamW step, clear the gradients
                loss_sum += loss * n_terms
                count += n_terms
                records.extend(objective.records(batch, epoch))
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
            if engine.data_parallel_size > 1:  # each rank added its share of each batch
                loss_sum = float(
                    engine.all_reduce(torch.tensor([loss_sum], dtype=torch.float64), "sum")[0]
                )
            epoch_losses.append(loss_sum / count)
            log.info("%s epoch %d: loss %.4f", model.kind, epoch, epoch_losses[-1])
    finally:
        bar.close()
        model.eval()
    metrics: dict[str, float] = {
        "loss_first_epoch": epoch_losses[0],
        "loss_last_epoch": epoch_losses[-1],
        "steps": float(steps),
        **objective.counts(examples),
    }
    return metrics, records
