"""What checking `\\boxed{}` answers with math-verify costs per 1,000 outputs in the labelling
and GRPO stages, beside the stages' own work on the same outputs.

    OMP_NUM_THREADS=2 .venv/bin/python bench/answer_check.py                   # warm start first
    OMP_NUM_THREADS=2 .venv/bin/python bench/answer_check.py --policy DIR      # a saved policy

Settings are the `math-style` preset's (task, tiny policy, GRPO and labelling budgets). The
policy is a saved one (`--policy`, e.g. a run's `policy/iter-0` checkpoint) or the preset's
warm start (not timed), so the outputs are a real policy's boxed answers, right and wrong.

- GRPO: `--grpo-steps` steps of the stage's own step (`grpo_step`: sampling, the verifier's
  1/0 for every output, the update through the stage's updater), each prompt x G outputs.
- Labelling: `--label-prompts` (default `rollout.prompts`) x G rollout outputs checked as the
  rollout stage checks them (the ORM labels), their ORM labels again (`orm_labels`, as the
  label stage), and Math-Shepherd labels of the first `labelling.prm_outputs` of them
  (`prm_labels_monte_carlo`: one check per completion, the exact step labels, whose last line
  is a math-verify comparison too).

Answer checking (`task.is_correct`, `task.step_labels`) is timed apart from the rest. Every
check is timed as itergrpo runs it (verdicts kept per (gold, answer) pair, the worker started
on the first check: that start is printed apart), then the same outputs are checked again in
the same order by a verifier that keeps no verdicts, in a fresh worker: what each check cost
before the cache. The machine-speed reference (bench/machine_speed.py) runs first.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from machine_speed import load, reference_line

from flows.config_files import load_config
from flows.engines.policy_updaters import build_policy_updater
from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.rewards import StepRewards
from grpo_core.algo.step import grpo_step, step_parts
from grpo_core.contracts.rollout import RolloutBatch, SamplingParams
from grpo_core.data import answer_formats
from grpo_core.data.math_equivalence import MathVerifier
from grpo_core.data.tasks.base import Problem
from grpo_core.data.tasks.registry import make_task
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.policy import build_policy, load_policy
from grpo_core.model.prompts import Prompter
from grpo_core.model.warm_start import warm_start
from reward_models.labelling import LabelledSample, orm_labels, prm_labels_monte_carlo

Check = tuple[str, Problem, str]  # (method, problem, completion): one call, replayed later


class TimedTask:
    """The task with its answer checks timed and recorded (for the replay without cache)."""

    def __init__(self, task: Any) -> None:
        self.task = task
        self.name, self.answer_format = task.name, task.answer_format
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: list[Check] = []

    def problems(self, split: Any, n: int, seed: int) -> list[Problem]:
        return list(self.task.problems(split, n, seed))

    def _timed(self, method: str, problem: Problem, completion: str) -> Any:
        start = time.perf_counter()
        result = getattr(self.task, method)(problem, completion)
        self.seconds[method] += time.perf_counter() - start
        self.calls.append((method, problem, completion))
        return result

    def is_correct(self, problem: Problem, completion: str) -> bool:
        return bool(self._timed("is_correct", problem, completion))

    def step_labels(self, problem: Problem, completion: str) -> list[bool] | None:
        result: list[bool] | None = self._timed("step_labels", problem, completion)
        return result

    def total(self) -> float:
        return sum(self.seconds.values())


class TimedSampler:
    """A rollout engine whose generate seconds and outputs are counted."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.seconds, self.outputs = engine, 0.0, 0

    def generate(
        self, prompts: list[str], n: int, params: SamplingParams, seed: int
    ) -> RolloutBatch:
        start = time.perf_counter()
        batch: RolloutBatch = self.engine.generate(prompts, n, params, seed)
        self.seconds += time.perf_counter() - start
        self.outputs += len(batch)
        return batch


def uncached_seconds(task: Any, calls: list[Check]) -> float:
    """The same checks, in the same order, by a verifier that keeps no verdicts (fresh
    worker, started before the clock): what they cost before the verdict cache."""
    fmt = task.answer_format
    verifier = MathVerifier(cache_size=0)
    verifier.equal("1", "1")  # start the worker and import math-verify off the clock
    task.answer_format = dataclasses.replace(fmt, equal=verifier.equal)
    try:
        start = time.perf_counter()
        for method, problem, completion in calls:
            getattr(task, method)(problem, completion)
        return time.perf_counter() - start
    finally:
        task.answer_format = fmt
        verifier.close()


def per_1000(seconds: float, n: int) -> str:
    return f"{seconds / max(n, 1) * 1000:.2f} s"


def hit_rate(before: Any, after: Any) -> str:
    hits, misses = after.hits - before.hits, after.misses - before.misses
    return f"{hits / max(hits + misses, 1):.0%} of {hits + misses} comparisons kept"


def bench_grpo(cfg: Any, task: Any, policy_dir: Path, steps: int) -> None:
    g = cfg.grpo
    model, tokenizer = load_policy(policy_dir)
    reference = None
    if g.algo.beta > 0:
        reference = load_policy(policy_dir)[0].eval().requires_grad_(False)
    timed = TimedTask(task)
    with tempfile.TemporaryDirectory(prefix="answer-check-") as tmp:
        updater = build_policy_updater(
            cfg.engines,
            g,
            torch.get_num_threads(),
            model,
            reference,
            Path(tmp),
            Path(tmp),
            cfg.policy.dtype,
        )
        sampler = TimedSampler(
            HFRolloutEngine(model, tokenizer, cfg.rollout.batch_size, show_progress=False)
        )
        update_seconds = 0.0
        prompter = Prompter(tokenizer, cfg.prompt, task.answer_format.instruction)
        pool = task.problems("train", steps * g.prompts_per_step, seed=cfg.run.seed)
        before = answer_formats.MATH_VERIFIER._equal.cache_info()
        start = time.perf_counter()
        for step in range(steps):
            problems = pool[step * g.prompts_per_step : (step + 1) * g.prompts_per_step]
            prompts = [prompter(p.question) for p in problems]

            def verifier_reward(batch: RolloutBatch, problems: list[Problem] = problems) -> Any:
                correct = torch.tensor(
                    [
                        float(timed.is_correct(problems[i], text))
                        for i, text in zip(batch.prompt_index, batch.texts, strict=True)
                    ]
                )
                return StepRewards(total=correct, parts={VERIFIER: correct}, rm=None)

            update = _timed_update(updater)
            parts = step_parts(
                sampler,
                update,
                g.algo,
                group_size=g.group_size,
                max_new_tokens=g.max_new_tokens,
                pad_token_id=tokenizer.pad_token_id,
            )
            grpo_step(parts, prompts, verifier_reward, seed=step)
            update_seconds += update.seconds
        wall = time.perf_counter() - start
        updater.close()
    after = answer_formats.MATH_VERIFIER._equal.cache_info()
    n, check = sampler.outputs, timed.total()
    accuracy = sum(task.is_correct(p, c) for _, p, c in timed.calls) / max(len(timed.calls), 1)
    before_cache = uncached_seconds(task, timed.calls)
    print(
        f"RESULT answer_check grpo: {steps} steps x {g.prompts_per_step} prompts x "
        f"G = {g.group_size}: {n} outputs (verifier accuracy {accuracy:.2f}), step wall "
        f"{per_1000(wall, n)} per 1000 outputs = sampling {per_1000(sampler.seconds, n)} + "
        f"update {per_1000(update_seconds, n)} + answer checks {per_1000(check, n)} "
        f"({check / wall:.1%} of the steps; {hit_rate(before, after)}); without the verdict "
        f"cache {per_1000(before_cache, n)} ({before_cache / (wall - check + before_cache):.1%})"
    )


def _timed_update(updater: Any) -> Any:
    """The stage's updater with its update's seconds recorded on `.seconds`."""

    class Timed:
        seconds = 0.0

        def update(self, *args: Any) -> dict[str, float]:
            start = time.perf_counter()
            stats: dict[str, float] = updater.update(*args)
            self.seconds += time.perf_counter() - start
            return stats

    return Timed()


def bench_labelling(cfg: Any, task: Any, model: Any, tokenizer: Any, prompts: int) -> None:
    lab, group = cfg.labelling, cfg.rollout.group_size
    problems = task.problems("train", prompts, seed=cfg.run.seed + 1)
    prompter = Prompter(tokenizer, cfg.prompt, task.answer_format.instruction)
    texts = [prompter(p.question) for p in problems]
    rollout = TimedSampler(HFRolloutEngine(model, tokenizer, lab.batch_size, show_progress=False))
    params = SamplingParams(max_new_tokens=cfg.rollout.max_new_tokens)
    batch = rollout.generate(texts, group, params, seed=cfg.run.seed + 1)
    samples = [
        LabelledSample(
            problem=problems[i],
            prompt_text=texts[i],
            completion=text,
            completion_ids=list(batch.completion_ids[r]),
            sample_index=r % group,
        )
        for r, (i, text) in enumerate(zip(batch.prompt_index, batch.texts, strict=True))
    ]
    timed = TimedTask(task)
    before = answer_formats.MATH_VERIFIER._equal.cache_info()
    in_rollout = _seconds(lambda: [timed.is_correct(s.problem, s.completion) for s in samples])
    checks_rollout = timed.total()
    in_orm = _seconds(lambda: orm_labels(timed, samples))
    checks_orm = timed.total() - checks_rollout
    engine = TimedSampler(HFRolloutEngine(model, tokenizer, lab.batch_size, show_progress=False))
    labelled = samples[: lab.prm_outputs]
    start = time.perf_counter()
    rows = prm_labels_monte_carlo(engine, tokenizer, timed, labelled, lab, seed=0)
    in_prm = time.perf_counter() - start
    checks_prm = timed.total() - checks_rollout - checks_orm
    after = answer_formats.MATH_VERIFIER._equal.cache_info()
    checked = len(timed.calls)
    stage = in_orm + in_prm
    stage_checks = checks_orm + checks_prm
    rollout_before_cache = uncached_seconds(task, timed.calls[: len(samples)])
    before_cache = uncached_seconds(task, timed.calls[len(samples) :])
    print(
        f"RESULT answer_check rollout: {len(samples)} outputs, sampling "
        f"{per_1000(rollout.seconds, len(samples))} per 1000 outputs, their checks "
        f"{per_1000(checks_rollout, len(samples))} = "
        f"{in_rollout / (rollout.seconds + in_rollout):.1%} of sampling + checks; without the "
        f"verdict cache {per_1000(rollout_before_cache, len(samples))}"
    )
    print(
        f"RESULT answer_check label: ORM labels of {len(samples)} outputs "
        f"({per_1000(checks_orm, len(samples))} per 1000, each already checked by the rollout "
        f"stage), Math-Shepherd labels of {len(labelled)} ({len(rows)} steps, "
        f"{engine.outputs} completions sampled in {engine.seconds:.1f} s = "
        f"{per_1000(engine.seconds, engine.outputs)} per 1000): {checked - len(samples)} "
        f"answer checks in the stage cost {per_1000(stage_checks, checked - len(samples))} per "
        f"1000 = {stage_checks / stage:.1%} of the stage's {stage:.1f} s "
        f"({hit_rate(before, after)}); without the verdict cache "
        f"{per_1000(before_cache, checked - len(samples))} per 1000 "
        f"({before_cache / (stage - stage_checks + before_cache):.1%})"
    )


def _seconds(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="math-style", help="preset or YAML")
    parser.add_argument("--policy", help="a saved policy directory (default: warm-start one)")
    parser.add_argument("--grpo-steps", type=int, default=5, help="GRPO steps to time")
    parser.add_argument("--label-prompts", type=int, help="rollout prompts (x G)")
    parser.add_argument("--no-reference", action="store_true", help="skip the machine speed")
    args = parser.parse_args(argv)
    threads = int(os.environ.get("OMP_NUM_THREADS", "2"))
    torch.set_num_threads(threads)
    print(f"torch {torch.__version__}, {threads} threads, {load()}")
    if not args.no_reference:
        print(reference_line())
    cfg = load_config(args.config)
    task = make_task(cfg.task)
    if args.policy:
        model, tokenizer = load_policy(Path(args.policy))
    else:
        model, tokenizer = build_policy(cfg.policy)
        warm = warm_start(model, tokenizer, task, cfg.warm_start, progress=False)
        print(f"warm start: {warm['steps']} steps in {warm['seconds']:.1f} s (not counted)")
    model.eval()
    start = time.perf_counter()
    answer_formats.MATH_VERIFIER.equal("1", "1")
    print(f"math-verify worker start and import: {time.perf_counter() - start:.2f} s (once)")
    bench_labelling(cfg, task, model, tokenizer, args.label_prompts or cfg.rollout.prompts)
    # The GRPO stage starts without labelling's verdicts here; in a run the process keeps them.
    answer_formats.MATH_VERIFIER.clear_cache()
    with tempfile.TemporaryDirectory(prefix="answer-check-policy-") as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        bench_grpo(cfg, task, Path(tmp), args.grpo_steps)
    print(f"{time.strftime('%Y-%m-%d %H:%M')}, {load()}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
