"""Tests share policy_0: a run's warm start whose every input matches an earlier one's
(starting weights, tokenizer, settings, training problems, prompt layout, torch threads and
RNG state) gets that warm start's weights, metrics and RNG state instead of training again.
Most end-to-end tests run the `micro` preset with the same warm start: training it is ~60%
of a micro run, and the suite ran it about a hundred times.

The cache is a directory shared by the xdist workers and the CLI runs they start
(`tests.flow_helpers.cli` runs `python -m tests.cli_shared_warm_starts`, which installs it
from `$ITERGRPO_TEST_WARM_STARTS`); entries are written atomically, so a run killed while
writing one leaves none. The warm start itself keeps its own tests
(tests/grpo_core/model/test_warm_start.py calls it directly, never through this cache), and
a test opts out with `@pytest.mark.fresh_warm_start`.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.progress import rounded
from grpo_core.data.tasks.base import Task
from grpo_core.model.config import WarmStartConfig
from grpo_core.model.policy import ensure_pad_token
from grpo_core.model.prompts import Prompter

log = logging.getLogger("grpo_core.model.warm_start")  # the line the warm start logs
ENV = "ITERGRPO_TEST_WARM_STARTS"
USES = "uses.log"  # a line per warm start: "trained" or "reused SECONDS"


@dataclass
class CachedWarmStart:
    weights: dict[str, torch.Tensor]
    metrics: dict[str, Any]
    rng_after: torch.Tensor


@dataclass
class WarmStartCache:
    """Warm starts by the digest of their inputs: in memory, and in `directory` for the
    other processes of the test run."""

    directory: Path | None = None
    entries: dict[str, CachedWarmStart] = field(default_factory=dict)

    def get(self, key: str) -> CachedWarmStart | None:
        if key not in self.entries and self.directory and (self.directory / key).is_file():
            self.entries[key] = CachedWarmStart(**torch.load(self.directory / key))
        return self.entries.get(key)

    def put(self, key: str, entry: CachedWarmStart) -> None:
        self.entries[key] = entry
        if self.directory:
            partial = self.directory / f".{key}.{os.getpid()}"
            torch.save(vars(entry), partial)
            partial.replace(self.directory / key)

    def record(self, use: str) -> None:
        if self.directory:
            with (self.directory / USES).open("a", encoding="utf-8") as log_file:
                log_file.write(use + "\n")


CACHE = WarmStartCache()


def uses_summary(directory: Path) -> str | None:
    """'N trained, M reused (S s of training not repeated)' from a cache directory's log."""
    path = directory / USES
    if not path.is_file():
        return None
    lines = path.read_text(encoding="utf-8").split()
    trained = lines.count("trained")
    saved = [float(x) for x in lines if x not in ("trained", "reused")]
    return f"{trained} trained, {len(saved)} reused ({sum(saved):.0f} s of training not repeated)"


def inputs_digest(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    cfg: WarmStartConfig,
    greedy: bool,
    prompter: Prompter | None,
) -> str:
    """SHA-256 of everything the warm start reads: a change in any of them is a miss."""
    digest = hashlib.sha256()

    def add(value: object) -> None:
        digest.update(repr(value).encode())
        digest.update(b"\0")

    for name, tensor in model.state_dict().items():
        add((name, tensor.dtype, tensor.device, tuple(tensor.shape)))
        digest.update(tensor.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    add(sorted(tokenizer.get_vocab().items()))
    add((tokenizer.special_tokens_map, getattr(tokenizer, "chat_template", None)))
    add(cfg.model_dump_json())
    add((type(task).__qualname__, task.name, greedy, torch.get_num_threads()))
    problems = task.problems("train", cfg.steps * cfg.batch_size, cfg.seed)
    add([(p.question, p.solution, p.answer) for p in problems])
    if prompter is not None and problems:
        add((prompter.config, prompter.answer_instruction))
        add((prompter(problems[0].question), prompter.gold_output(problems[0].solution)))
    digest.update(torch.get_rng_state().numpy().tobytes())
    return digest.hexdigest()


def cached(warm_start: Callable[..., dict[str, Any]]) -> Callable[..., dict[str, Any]]:
    """`warm_start`, reusing an earlier call's result for the same inputs (a wall-clock
    budget, `max_seconds`, is never reused: where it stops depends on the machine)."""

    def warm_start_once(
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        task: Task,
        cfg: WarmStartConfig,
        progress: bool = True,
        greedy_sampler: Any = None,
        prompter: Prompter | None = None,
    ) -> dict[str, Any]:
        def train() -> dict[str, Any]:
            return warm_start(
                model, tokenizer, task, cfg, progress, greedy_sampler=greedy_sampler,
                prompter=prompter,
            )  # fmt: skip

        if cfg.max_seconds is not None:
            return train()
        key = inputs_digest(model, tokenizer, task, cfg, greedy_sampler is not None, prompter)
        hit = CACHE.get(key)
        if hit is None:
            metrics = train()
            weights = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
            CACHE.put(key, CachedWarmStart(weights, dict(metrics), torch.get_rng_state()))
            CACHE.record("trained")
            return metrics
        ensure_pad_token(tokenizer)
        model.load_state_dict(hit.weights)
        model.eval()
        torch.set_rng_state(hit.rng_after)
        CACHE.record(f"reused {float(hit.metrics.get('seconds', 0.0)):.2f}")
        log.info("warm start: %s", rounded(hit.metrics))
        return dict(hit.metrics)

    return warm_start_once


def install(directory: Path) -> None:
    """Route this process's warm-start stage through the cache in `directory`."""
    from flows.stages import warm_start as stage

    CACHE.directory = directory
    stage.warm_start = cached(stage.warm_start)  # type: ignore[assignment]
