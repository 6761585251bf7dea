"""The GRPO stage's checkpoints: its progress checkpoint (weights or LoRA adapters, optimizer,
RNG, step and prompt cursor, the rows of finished steps, the critic), where a rerun resumes
from until the stage commits (then removed, unless store.progress_checkpoints = keep), and
policy_{k+1} at the end."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from flows.engines.lora_updater import ADAPTERS_DIR
from flows.engines.policy_updaters import PolicyUpdater
from flows.progress import log
from flows.stages.critic import save_critic_progress
from grpo_core.algo.critic_update import CriticLearner
from grpo_core.model.lora import ADAPTER_WEIGHTS, LoRAAdapters
from grpo_core.model.policy import holds_weights, load_weights_into
from storage.checkpoints import (
    TRAINING_STATE_FILE,
    capture_rng_state,
    checkpoints_of,
    load_training_state,
    remove_checkpoint,
    restore_rng_state,
    save_checkpoint,
    save_training_state,
)

SAMPLES_FILE = "policy_samples.parquet"
METRICS_FILE = "metrics.parquet"
IN_FLIGHT_FILE = "async_in_flight.json"  # grpo.async: the batches sampled ahead

Row = dict[str, Any]


@dataclass(frozen=True)
class ResumePoint:
    """Where the stage's steps start: step 0 of a fresh stage, or the step after its last
    progress checkpoint, with the rows of the steps before it and the prompt cursor."""

    resumed: bool = False
    next_step: int = 0
    sample_rows: list[Row] = field(default_factory=list)
    metric_rows: list[Row] = field(default_factory=list)
    next_prompt: int = 0
    in_flight: list[Row] = field(default_factory=list)  # grpo.async: sampled ahead


def save_progress(
    path: Path,
    model: Any,
    tokenizer: Any,
    updater: PolicyUpdater,
    next_step: int,
    sample_rows: list[Row],
    metric_log: list[Row],
    next_prompt: int,
    critic: CriticLearner | None = None,
    adapters: LoRAAdapters | None = None,
    in_flight: list[Row] | None = None,
) -> None:
    """The stage's progress checkpoint at `path`, atomically: after it, the step `next_step`
    and the prompt cursor at `next_prompt` come next (and under grpo.async the batches
    `in_flight` already sampled for the steps from `next_step` on)."""

    def write(tmp: Path) -> None:
        if adapters is not None:  # LoRA: the base is policy_k's checkpoint, never changed
            adapters.save(tmp / ADAPTERS_DIR)
        else:
            updater.save_weights(model, tmp)
        tokenizer.save_pretrained(tmp)
        save_training_state(
            tmp,
            optimizer_state=updater.save_state(tmp),
            rng_state=capture_rng_state(),
            extra={"next_step": next_step, "next_prompt": next_prompt},
        )
        pq.write_table(pa.Table.from_pylist(sample_rows), tmp / SAMPLES_FILE)
        pq.write_table(pa.Table.from_pylist(metric_log), tmp / METRICS_FILE)
        save_critic_progress(tmp, critic)
        if in_flight is not None:
            (tmp / IN_FLIGHT_FILE).write_text(json.dumps(in_flight))

    save_checkpoint(path, write, overwrite=True)


def save_policy(
    path: Path, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, updater: PolicyUpdater
) -> None:
    """policy_{k+1}: the updater's weights and the tokenizer, atomically."""

    def write(tmp: Path) -> None:
        updater.save_weights(model, tmp)
        tokenizer.save_pretrained(tmp)

    save_checkpoint(path, write, overwrite=True)


def resume_weights(path: Path, model: Any, adapters: LoRAAdapters | None = None) -> bool:
    """Load the weights of the stage's last progress checkpoint, if there is one (with LoRA:
    its adapters).

    Before the engine is built: DeepSpeed copies the weights into its optimizer at start.
    """
    if adapters is not None:
        saved = path / ADAPTERS_DIR
        if not (saved / ADAPTER_WEIGHTS).is_file() or adapters.differences(saved):
            if (path / TRAINING_STATE_FILE).is_file():  # grpo.lora changed since: start over
                log.info("GRPO: %s was saved with other grpo.lora settings; starting over", path)
            return False
        adapters.load(saved)
        return True
    if not (path / "config.json").is_file():
        return False
    if holds_weights(model):  # else the training ranks load them (updater.load_state)
        load_weights_into(model, path)
    return True


def resume_point(path: Path, updater: PolicyUpdater, per_step: int) -> ResumePoint:
    """The ResumePoint of the last progress checkpoint, its optimizer state loaded and its RNG
    state restored; a checkpoint of a version without the cursor had it at step x per_step."""
    state = load_training_state(path)
    updater.load_state(path, state["optimizer_state"])
    restore_rng_state(state["rng_state"])
    samples = pq.read_table(path / SAMPLES_FILE).to_pylist()
    metrics = pq.read_table(path / METRICS_FILE).to_pylist()
    log.info("GRPO: resuming at step %d from %s", state["extra"]["next_step"], path)
    next_step = int(state["extra"]["next_step"])
    next_prompt = int(state["extra"].get("next_prompt", next_step * per_step))
    in_flight_file = path / IN_FLIGHT_FILE
    in_flight = json.loads(in_flight_file.read_text()) if in_flight_file.is_file() else []
    return ResumePoint(True, next_step, samples, metrics, next_prompt, in_flight)


def remove_committed_progress(
    root: Path, run_id: str, role: str, committed: Callable[[int], bool]
) -> list[int]:
    """Remove the progress checkpoints (`role` of run `run_id` in store `root`) of every
    iteration whose GRPO stage `committed` says is committed: no rerun reads them again. Every
    committed one, so one a kill kept after its commit goes at the next; the iterations removed."""
    removed = []
    for k, path in checkpoints_of(root, run_id, role):
        if committed(k):
            remove_checkpoint(path)
            removed.append(k)
    if removed:
        log.debug("GRPO: removed the progress checkpoints of iterations %s", removed)
    return removed
