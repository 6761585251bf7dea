"""Warm-start SFT: policy_0 from gold solutions, a share of them carrying one wrong step.

Loss on completion tokens only (the prompt is formatted exactly as rollout formats it), AdamW
with linear warm-up and cosine decay, a fixed step budget (deterministic) and an optional
wall-clock cap.
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from grpo_core.contracts.numerics import require_finite
from grpo_core.contracts.progress import progress_bar, rounded
from grpo_core.contracts.rollout import Sampler, SamplingParams
from grpo_core.data.tasks.base import Problem, Task
from grpo_core.model.config import WarmStartConfig
from grpo_core.model.policy import encode_prompt, ensure_pad_token
from grpo_core.model.prompts import Prompter

log = logging.getLogger(__name__)
_LAST_NUMBER = re.compile(r"-?\d+(?!.*\d)")


def inject_step_error(solution: str, rng: random.Random) -> str:
    """Generic error: the last number of one random non-final line shifted by 1-3."""
    lines = solution.split("\n")
    candidates = [i for i, line in enumerate(lines[:-1]) if _LAST_NUMBER.search(line)]
    if not candidates:
        return solution
    i = rng.choice(candidates)
    match = _LAST_NUMBER.search(lines[i])
    assert match is not None
    wrong = int(match.group()) + rng.choice([-3, -2, -1, 1, 2, 3])
    lines[i] = lines[i][: match.start()] + str(wrong) + lines[i][match.end() :]
    return "\n".join(lines)


def training_text(task: Task, problem: Problem, error_rate: float, rng: random.Random) -> str:
    """The solution to train on: gold, or with prob. `error_rate` one with a wrong step
    (the task's own `corrupt(problem, rng)` when it has one, else `inject_step_error`)."""
    if problem.solution is None:
        raise ValueError(
            f"warm start needs gold solutions; task {task.name} problem {problem.problem_id} "
            "has none (use a task with solutions or skip warm start)"
        )
    if rng.random() >= error_rate:
        return problem.solution
    corrupt = getattr(task, "corrupt", None)
    return corrupt(problem, rng) if corrupt else inject_step_error(problem.solution, rng)


def sft_batch(
    tokenizer: PreTrainedTokenizerBase, prompts: list[str], completions: list[str]
) -> dict[str, torch.Tensor]:
    """Right-padded input_ids / attention_mask / labels; labels are -100 except on completion
    tokens and the final EOS."""
    rows, labels = [], []
    for prompt, completion in zip(prompts, completions, strict=True):
        p = encode_prompt(tokenizer, prompt)
        c = [*tokenizer(completion, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        rows.append(p + c)
        labels.append([-100] * len(p) + c)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    return {
        "input_ids": torch.tensor([r + [pad] * (width - len(r)) for r in rows]),
        "attention_mask": torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows]),
        "labels": torch.tensor([x + [-100] * (width - len(x)) for x in labels]),
    }


def _lr_at(step: int, cfg: WarmStartConfig) -> float:
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    frac = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
    return cfg.lr_min + 0.5 * (cfg.lr - cfg.lr_min) * (1 + math.cos(math.pi * min(1.0, frac)))


def warm_start(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    task: Task,
    cfg: WarmStartConfig,
    progress: bool = True,
    greedy_sampler: Sampler | None = None,
    prompter: Prompter | None = None,
) -> dict[str, Any]:
    """SFT `model` in place on `task`'s train split; metrics: steps, seconds, loss, and the
    greedy accuracy of `greedy_sampler` (a rollout engine over `model`) when one is given
    and cfg.eval_prompts > 0."""
    ensure_pad_token(tokenizer)
    prompt = prompter or Prompter(tokenizer)
    rng = random.Random(cfg.seed)
    problems = task.problems("train", cfg.steps * cfg.batch_size, cfg.seed)
    if not problems:
        raise ValueError(f"task {task.name} has no train problems to warm-start on")
    device = next(model.parameters()).device
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay
    )
    model.train()
    start, losses, step = time.perf_counter(), [], 0
    bar = progress_bar(cfg.steps, "warm start", "step", enabled=progress)
    for step in range(cfg.steps):
        if cfg.max_seconds is not None and time.perf_counter() - start > cfg.max_seconds:
            break
        # A train split smaller than steps x batch_size is cycled through (epochs over it).
        chunk = [
            problems[(step * cfg.batch_size + i) % len(problems)] for i in range(cfg.batch_size)
        ]
        batch = sft_batch(
            tokenizer,
            [prompt(p.question) for p in chunk],
            [prompt.gold_output(training_text(task, p, cfg.error_rate, rng)) for p in chunk],
        )
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, cfg)
        loss = model(**{k: v.to(device) for k, v in batch.items()}).loss
        require_finite("warm-start loss", loss, where=f"step {step}", cause="lower warm_start.lr")
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        bar.update(1)
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    else:
        step = cfg.steps
    bar.close()
    model.eval()
    metrics: dict[str, Any] = {
        "steps": step,
        "seconds": time.perf_counter() - start,
        "loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
    }
    if cfg.eval_prompts and greedy_sampler is not None:
        metrics["greedy_accuracy"] = greedy_accuracy(
            greedy_sampler,
            prompt,
            task,
            task.problems("test", cfg.eval_prompts, cfg.seed),
            cfg.max_new_tokens,
        )
    log.info("warm start: %s", rounded(metrics))
    return metrics


def greedy_accuracy(
    sampler: Sampler,
    prompter: Callable[[str], str],
    task: Task,
    problems: list[Problem],
    max_new_tokens: int = 64,
) -> float:
    """Share of `problems` whose greedy completion by `sampler` is correct."""
    batch = sampler.generate(
        [prompter(p.question) for p in problems],
        1,
        SamplingParams(max_new_tokens=max_new_tokens, temperature=0.0),
        seed=0,
    )
    return sum(
        task.is_correct(p, text) for p, text in zip(problems, batch.texts, strict=True)
    ) / max(1, len(problems))
