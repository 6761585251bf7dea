"""Padding share of a GRPO update's micro-batches: fixed rows, a token budget, and a token
budget with padding_free (packed rows).

A step's rows are synthetic reasoning-length outputs: P prompts of 60-200 tokens, G samples
each, completion lengths log-uniform over 50-4000 tokens (seeded). For each plan it prints
the share of padded positions in what the forwards compute (rows x width, summed over the
micro-batches; grpo_core/algo/micro_batches.py::padding_share), the number of passes and the
largest pass in token positions. Fixed rows (grpo.algo.micro_batch_size) keep the whole
batch's columns, as the update runs them; "own width" is what trimming alone would give.
"packed" is grpo.algo.padding_free: each pass one row of its rows' tokens, the budget bounding
that sum, so no padded position is computed (under sdpa/eager attention the masked blocks of
the packed row's attention still are: "dense attn" is the attention score entries computed,
each packed row's tokens squared, over those of the padded budget plan; "varlen attn" the
same for flash_attention_2's varlen kernel, each sequence's length squared).

With `--store DIR --run RUN` the rows are a stored run's instead: each GRPO step's outputs
(`policy_samples.n_completion_tokens`, by iteration and step), each with the run's mean prompt
length (`rollouts.n_prompt_tokens`; the stored GRPO rows keep no prompt length), e.g. a
`math-style` run's reasoning outputs.

    .venv/bin/python bench/padding_share.py
    .venv/bin/python bench/padding_share.py --prompts 64 --group-size 8 --seeds 5
    .venv/bin/python bench/padding_share.py --store /tmp/store --run math-1k --budgets 2048 4096
"""

from __future__ import annotations

import argparse
import math
import subprocess
from collections.abc import Sequence
from datetime import date
from pathlib import Path

import torch

from grpo_core.algo.micro_batches import padding_share, plan_micro_batches

REPO = Path(__file__).resolve().parents[1]


def step_lengths(prompts: int, group_size: int, seed: int) -> list[int]:
    """Prompt + completion tokens of each row of one step's batch."""
    gen = torch.Generator().manual_seed(seed)
    prompt = torch.randint(60, 201, (prompts,), generator=gen).repeat_interleave(group_size)
    log_len = torch.empty(prompts * group_size).uniform_(
        math.log(50), math.log(4000), generator=gen
    )
    completion = log_len.exp().round().long()
    lengths: list[int] = (prompt + completion).tolist()
    return lengths


def stored_steps(store: Path, run_id: str) -> list[tuple[str, list[int]]]:
    """(label, prompt + completion tokens of each row) of every stored GRPO step of a run."""
    from storage.store import RunStore

    runs = RunStore(store)
    prompts = runs.read("rollouts", run_id=run_id, columns=["n_prompt_tokens"]).column(0)
    prompt = round(sum(prompts.to_pylist()) / max(len(prompts), 1))
    rows = runs.read(
        "policy_samples", run_id=run_id, columns=["iteration", "step", "n_completion_tokens"]
    ).to_pylist()
    steps: dict[tuple[int, int], list[int]] = {}
    for r in rows:
        steps.setdefault((r["iteration"], r["step"]), []).append(prompt + r["n_completion_tokens"])
    if not steps:
        raise SystemExit(f"run {run_id!r} in {store} has no stored GRPO steps")
    return [(f"iteration {k} step {s}", lengths) for (k, s), lengths in sorted(steps.items())]


def fixed_rows(rows: int, size: int) -> list[list[int]]:
    return [list(range(start, min(start + size, rows))) for start in range(0, rows, size)]


def describe(lengths: Sequence[int], plan: list[list[int]], width: int | None) -> str:
    sizes = [
        len(rows) * (max(lengths[r] for r in rows) if width is None else width) for rows in plan
    ]
    share = padding_share(lengths, plan, width)
    return f"padding {share:6.1%}  passes {len(plan):4d}  largest pass {max(sizes):7d} positions"


def attention_entries(lengths: Sequence[int], plan: list[list[int]], packed: bool) -> int:
    """Attention score entries a dense kernel computes: per pass rows x width^2, or a packed
    row's tokens^2."""
    if packed:
        return sum(sum(lengths[r] for r in rows) ** 2 for rows in plan)
    return sum(len(rows) * max(lengths[r] for r in rows) ** 2 for rows in plan)


def varlen_entries(lengths: Sequence[int]) -> int:
    """Attention score entries of a varlen kernel: each sequence's own square."""
    return sum(n**2 for n in lengths)


def describe_packed(lengths: Sequence[int], budget: int) -> str:
    plan = plan_micro_batches(lengths, budget, packed=True)
    sizes = [sum(lengths[r] for r in rows) for rows in plan]
    dense = attention_entries(lengths, plan, True)
    padded = attention_entries(lengths, plan_micro_batches(lengths, budget), False)
    return (
        f"padding {0.0:6.1%}  passes {len(plan):4d}  largest pass {max(sizes):7d} positions"
        f"  dense attn x{dense / padded:5.2f}  varlen attn x{varlen_entries(lengths) / padded:4.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--micro-batch-size", type=int, default=8)
    parser.add_argument("--budgets", type=int, nargs="+", default=[8192, 16384, 32768])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--store", type=Path, help="a run store: its run's GRPO steps' rows")
    parser.add_argument("--run", help="the run id, with --store")
    args = parser.parse_args()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
    ).stdout.strip()
    if args.store:
        if not args.run:
            parser.error("--store needs --run RUN_ID")
        print(f"run {args.run} in {args.store}, {date.today()}, commit {commit}")
        steps = stored_steps(args.store, args.run)
    else:
        print(
            f"{args.prompts} prompts x G = {args.group_size}, completions 50-4000 tokens "
            f"(log-uniform), {date.today()}, commit {commit}"
        )
        steps = [
            (f"seed {seed}", step_lengths(args.prompts, args.group_size, seed))
            for seed in range(args.seeds)
        ]
    for name, lengths in steps:
        rows, width = len(lengths), max(lengths)
        print(f"{name}: {rows} rows, {sum(lengths)} tokens, longest {width}")
        fixed = fixed_rows(rows, args.micro_batch_size)
        label = f"{args.micro_batch_size} rows per pass"
        print(f"  {label:<28s} {describe(lengths, fixed, width)}")
        print(f"  {label + ', own width':<28s} {describe(lengths, fixed, None)}")
        for budget in args.budgets:
            plan = plan_micro_batches(lengths, budget)
            print(f"  {f'budget {budget} tokens':<28s} {describe(lengths, plan, None)}")
            label = f"budget {budget} tokens, packed"
            print(f"  {label:<28s} {describe_packed(lengths, budget)}")


if __name__ == "__main__":
    main()
