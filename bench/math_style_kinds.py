"""Accuracy of a math_style run's policies by kind of question, on the evaluation stage's
held-out problems: which kinds the tiny policy learns and which it does not.

    OMP_NUM_THREADS=2 .venv/bin/python bench/math_style_kinds.py RUN_ID --store STORE

For each stored policy_k of the run: greedy accuracy and the mean accuracy of `--samples`
samples per problem (temperature 1), per kind and overall, on the `evaluation.n_prompts`
test problems the evaluate stage draws (same seed, so the same questions). Reads the run's
stored config; samples with the HF engine on CPU.
"""

from __future__ import annotations

import argparse
import os
from collections import defaultdict
from pathlib import Path

import torch

from flows.config import ItergrpoConfig
from flows.config_files import stored_config_migrated, validate_config
from grpo_core.contracts.rollout import SamplingParams
from grpo_core.data.tasks.math_style import KINDS
from grpo_core.data.tasks.registry import make_task
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.model.policy import load_policy
from grpo_core.model.prompts import Prompter
from storage.checkpoints import checkpoint_path
from storage.store import RunStore


def accuracy_by_kind(
    cfg: ItergrpoConfig, policy_dir: Path, samples: int
) -> dict[str, tuple[float, float, int]]:
    """kind -> (greedy accuracy, sampled accuracy, problems), plus 'all'."""
    task = make_task(cfg.task)
    problems = task.problems("test", cfg.evaluation.n_prompts, seed=cfg.run.seed)
    model, tokenizer = load_policy(policy_dir)
    engine = HFRolloutEngine(model.eval(), tokenizer, cfg.rollout.batch_size, show_progress=False)
    prompter = Prompter(tokenizer, cfg.prompt, task.answer_format.instruction)
    prompts = [prompter(p.question) for p in problems]
    budget = cfg.evaluation.max_new_tokens
    greedy = engine.generate(prompts, 1, SamplingParams(budget, temperature=0.0), seed=0)
    sampled = engine.generate(prompts, samples, SamplingParams(budget), seed=cfg.run.seed)
    right: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for i, p in enumerate(problems):
        hits = sum(task.is_correct(p, sampled.texts[i * samples + j]) for j in range(samples))
        for kind in (p.meta["kind"], "all"):
            right[kind][0] += task.is_correct(p, greedy.texts[i])
            right[kind][1] += hits / samples
            right[kind][2] += 1
    return {k: (g / n, s / n, int(n)) for k, (g, s, n) in right.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_id")
    parser.add_argument("--store", default=os.environ.get("ITERGRPO_STORE", "itergrpo-store"))
    parser.add_argument("--samples", type=int, default=4, help="samples per problem")
    args = parser.parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    store = RunStore(Path(args.store))
    cfg = validate_config(stored_config_migrated(store.run_config(args.run_id)))
    if cfg.task.name != "math_style":
        raise SystemExit(f"run {args.run_id} is on task {cfg.task.name}, not math_style")
    kinds = [k for k in KINDS if k in cfg.task.math_style.kinds]
    print(f"policy  {'':>6}" + "".join(f"{k:>22}" for k in [*kinds, "all"]))
    for k in range(cfg.run.iterations + 1):
        policy_dir = checkpoint_path(store.root, args.run_id, "policy", k)
        if not (policy_dir / "config.json").is_file():
            break
        by_kind = accuracy_by_kind(cfg, policy_dir, args.samples)
        cells = "".join(
            f"{by_kind[kind][0]:>9.3f} / {by_kind[kind][1]:.3f} ({by_kind[kind][2]:>3})"
            if kind in by_kind
            else f"{'-':>22}"
            for kind in [*kinds, "all"]
        )
        print(f"{k:>6}  greedy / sampled  {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
