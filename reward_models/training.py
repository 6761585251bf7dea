"""Reward-model training: examples from label rows, BCE updates, and the record of what was seen.

Continual training (docs/algorithm.md section 7): iteration 0 starts from the RM's source, iteration
k > 0 from the k-1 reward model, on new labels plus a replay sample of earlier ones. Every
example is re-tokenized from (prompt text, completion text) by the RM's own encoder, so
replayed rows read back from the store train exactly like new ones, whatever the RM's tokenizer.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F

from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.numerics import require_finite
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.contracts.progress import progress_bar
from grpo_core.contracts.training import OptimizerSettings, TrainEngine
from grpo_core.engines.train import TorchEngine
from grpo_core.model.checkpointing import set_gradient_checkpointing
from reward_models.config import RewardModelConfig, RMKind
from reward_models.labelling import LabelledSample, OrmLabel, PrmLabel
from reward_models.models import RewardModel
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


def _check_examples(model: RewardModel, examples: Sequence[RMExample], max_length: int) -> None:
    if not examples:
        raise ValueError("no reward-model training examples: label some rollouts first")
    for e in examples:
        if e.rm_kind != model.kind:
            raise ValueError(f"{e.rm_kind} example {e.problem_id} given to a {model.kind} model")
        length = len(e.prompt_ids) + len(e.completion_ids)
        if length > max_length:
            raise SettingError(
                f"example {e.problem_id}#{e.sample_index} has {length} tokens in the "
                f"{model.kind.upper()}'s tokenizer > reward_models.max_length {max_length}: "
                "raise max_length"
            )


def rm_optimizer_settings(cfg: RewardModelConfig) -> OptimizerSettings:
    """The optimizer settings of a TrainEngine (TorchEngine, DeepSpeedEngine) training an RM."""
    return OptimizerSettings(
        lr=cfg.lr, weight_decay=RM_WEIGHT_DECAY, max_grad_norm=RM_MAX_GRAD_NORM
    )


def _batch_loss(
    model: torch.nn.Module,
    batch: Sequence[RMExample],
    pad_id: int,
    device: torch.device,
    normaliser: int | None = None,
) -> tuple[torch.Tensor, int]:
    """Mean BCE-with-logits over every read position of the batch, and their count; with a
    `normaliser`, their sum divided by it (a rank's share of a mini-batch of that many)."""
    policy_batch = build_policy_batch(
        [e.prompt_ids for e in batch], [e.completion_ids for e in batch], pad_id, "right"
    ).to(device)
    logits = model(policy_batch.input_ids, policy_batch.attention_mask, policy_batch.position_ids)
    rows = [r for r, e in enumerate(batch) for _ in e.read_positions]
    cols = [len(e.prompt_ids) + p for e in batch for p in e.read_positions]
    targets = torch.tensor([t for e in batch for t in e.targets], device=logits.device)
    picked = logits[torch.tensor(rows), torch.tensor(cols)].float()
    if normaliser is None:
        return F.binary_cross_entropy_with_logits(picked, targets), len(rows)
    summed = F.binary_cross_entropy_with_logits(picked, targets, reduction="sum")
    return summed / normaliser, len(rows)


def _rank_share_loss(
    engine: TrainEngine, batch: Sequence[RMExample], pad_id: int
) -> tuple[torch.Tensor, int]:
    """This data-parallel rank's part of the batch's mean BCE (every `world`-th example from
    its rank on, its summed loss over the whole batch's read positions: the ranks' backwards
    add up to the mean's gradient), and the batch's count. A rank with no example runs one
    example at weight 0: DDP and DeepSpeed need every rank's backward."""
    rank, world = engine.data_parallel_rank, engine.data_parallel_size
    total = sum(len(e.read_positions) for e in batch)
    share = list(batch[rank::world])
    part, weight = (share, 1.0) if share else (list(batch[:1]), 0.0)
    loss, _ = _batch_loss(engine.forward_model, part, pad_id, engine.device, total)
    return loss * weight, total


def train_reward_model(
    model: RewardModel,
    examples: Sequence[RMExample],
    cfg: RewardModelConfig,
    seed: int,
    progress: bool = True,
    engine: TrainEngine | None = None,
) -> tuple[dict[str, float], list[TrainedRow]]:
    """BCE training in seeded shuffled mini-batches; metrics and the rows seen.

    Each mini-batch is one step of `engine`, which wraps `model`: by default a TorchEngine
    (AdamW, settings from rm_optimizer_settings); a DeepSpeedEngine built on `model` with the
    same settings trains the same way. With engine.data_parallel_size > 1 (training ranks)
    every rank passes the same examples and seed, runs its share of each mini-batch, and
    returns the same metrics and records. The records list one row per target per epoch, in
    the order the trainer used them.
    """
    _check_examples(model, examples, cfg.max_length)
    pad_id = model.tokenizer.pad_token_id
    if engine is None:
        engine = TorchEngine(model, rm_optimizer_settings(cfg))
    device = engine.device
    generator = torch.Generator().manual_seed(seed)
    steps_per_epoch = math.ceil(len(examples) / cfg.batch_size)
    records: list[TrainedRow] = []
    epoch_losses: list[float] = []
    engine.zero_grad()
    engine.train()
    set_gradient_checkpointing(engine.model, cfg.gradient_checkpointing)
    bar = progress_bar(
        cfg.epochs * steps_per_epoch, f"train {model.kind}", "batch", enabled=progress
    )
    try:
        for epoch in range(cfg.epochs):
            order = torch.randperm(len(examples), generator=generator).tolist()
            loss_sum, count = 0.0, 0
            for start in range(0, len(order), cfg.batch_size):
                batch = [examples[i] for i in order[start : start + cfg.batch_size]]
                if engine.data_parallel_size > 1:
                    loss, n_targets = _rank_share_loss(engine, batch, pad_id)
                else:
                    loss, n_targets = _batch_loss(engine.forward_model, batch, pad_id, device)
                require_finite(
                    f"{model.kind.upper()} training loss",
                    loss,
                    where=f"epoch {epoch}, batch {start // cfg.batch_size}",
                    cause="lower reward_models.lr, or a corrupt RM checkpoint",
                )
                engine.backward(loss)
                engine.step()  # clip to RM_MAX_GRAD_NORM, AdamW step, clear the gradients
                loss_sum += loss.item() * n_targets
                count += n_targets
                records.extend(_records(batch, epoch))
                bar.update(1)
                bar.set_postfix(loss=f"{loss.item():.4f}")
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
        "steps": float(cfg.epochs * steps_per_epoch),
        "examples": float(len(examples)),
        "targets": float(sum(len(e.targets) for e in examples)),
        "examples_new": float(sum(e.source == "new" for e in examples)),
        "examples_replay": float(sum(e.source == "replay" for e in examples)),
    }
    return metrics, records


def _records(batch: Sequence[RMExample], epoch: int) -> list[TrainedRow]:
    return [
        TrainedRow(
            e.rm_kind,
            e.problem_id,
            e.sample_index,
            None if e.step_indices is None else e.step_indices[j],
            target,
            e.source,
            e.origin_iteration,
            epoch,
            e.source_table,
        )
        for e in batch
        for j, target in enumerate(e.targets)
    ]
