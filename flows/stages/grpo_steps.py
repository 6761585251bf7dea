"""What each GRPO step leaves behind: its progress and log lines, its `policy_samples` rows,
and, for the stage, the guards' verdict on what its steps were paid (flows/guards.py)."""

from __future__ import annotations

from typing import Any

from flows.guards import (
    EQUAL_REWARDS,
    OVER_OPTIMISATION,
    GuardChecks,
    equal_rewards_finding,
    over_optimisation_finding,
)
from flows.progress import ProgressFn, log
from grpo_core.algo.step import SKIP_EXPLAINED, StepOutcome
from grpo_core.data.tasks.base import Problem


def check_step_rewards(
    checks: GuardChecks, k: int, metric_log: list[dict[str, Any]]
) -> GuardChecks:
    """The guards on what the stage's steps were paid: the learned reward over-paying against
    the verifier (steps with an RM reward), and steps with no reward contrast at all."""
    per_step: dict[int, dict[str, float]] = {}
    for row in metric_log:
        if row["step"] is not None:
            per_step.setdefault(int(row["step"]), {})[str(row["name"])] = float(row["value"])
    steps = [per_step[s] for s in sorted(per_step)]
    paid = [s for s in steps if "rm_reward_mean" in s]
    guards = checks.guards
    if paid:
        finding = over_optimisation_finding(
            [s["rm_reward_mean"] for s in paid],
            [s["verifier_accuracy"] for s in paid],
            guards.over_optimisation_gap,
            guards.over_optimisation_steps,
            k,
        )
        checks.check(OVER_OPTIMISATION, finding)
    shares = [s["equal_reward_groups"] for s in steps if "equal_reward_groups" in s]
    checks.check(EQUAL_REWARDS, equal_rewards_finding(shares, guards.equal_rewards_share, k))
    return checks


def report_step(k: int, step: int, steps: int, out: StepOutcome, progress: ProgressFn) -> None:
    """The progress line and log line of one step (a skipped step says why)."""
    stats = out.stats
    if out.skipped is not None:
        progress((step + 1) / steps, f"GRPO step {step + 1}/{steps}: skipped ({out.skipped})")
        log.warning(
            "GRPO iter %d step %d: skipped, no update (%s: %s)",
            k,
            step,
            out.skipped,
            SKIP_EXPLAINED[out.skipped],
        )
        return
    progress((step + 1) / steps, f"GRPO step {step + 1}/{steps}: reward {stats['reward_mean']:.3f}")
    # the learned reward models' part only when they reward (a verifier-only run has none)
    learned = f" (RM {stats['rm_reward_mean']:.3f})" if "rm_reward_mean" in stats else ""
    log.info(
        "GRPO iter %d step %d: reward %.3f%s verifier acc %.3f kl %s",
        k,
        step,
        stats["reward_mean"],
        learned,
        stats["verifier_accuracy"],
        f"{stats['kl']:.4f}" if "kl" in stats else "- (none applied)",
    )
    if "dpo_loss" in stats:  # DPO: its pairs, loss and implicit reward (algorithm.md 12)
        log.info(
            "GRPO iter %d step %d: DPO on %d pairs, loss %.4f, reward margin %.4f, accuracy %.2f",
            k,
            step,
            stats["dpo_pairs"],
            stats["dpo_loss"],
            stats["dpo_reward_margin"],
            stats["dpo_reward_accuracy"],
        )
    if "prompts_drawn" in stats:  # dynamic sampling: what it took to fill the batch
        log.info(
            "GRPO iter %d step %d: dynamic sampling drew %d prompts in %d rounds, dropped %d "
            "equal-reward groups%s",
            k,
            step,
            stats["prompts_drawn"],
            stats["sampling_rounds"],
            stats["groups_dropped"],
            "" if stats["batch_filled"] else " (batch not filled: the round cap was reached)",
        )


def policy_sample_rows(
    step: int, problems: list[Problem], out: StepOutcome, group_size: int
) -> list[dict[str, Any]]:
    """Rows of `policy_samples` for one step: each output, its rewards and its mean advantage."""
    batch, rewards, advantages, stats = out.batch, out.rewards, out.advantages, out.stats
    lengths = [len(ids) for ids in batch.completion_ids]
    seq_adv = [
        float(advantages[r, : max(n, 1)].mean()) if n else 0.0 for r, n in enumerate(lengths)
    ]
    return [
        {
            "step": step,
            "problem_id": problems[batch.prompt_index[r]].problem_id,
            "sample_index": r % group_size,
            "completion": batch.texts[r],
            "reward": float(rewards.per_output[r]),
            "reward_parts": {name: float(score[r]) for name, score in rewards.parts.items()},
            "reward_rm": None if rewards.rm is None else float(rewards.rm[r]),
            "advantage": seq_adv[r],
            "kl": stats.get("kl"),  # NULL where the step applied no KL (no term, no penalty)
            "ratio_mean": stats.get("ratio_mean", 1.0),
            "ratio_max": stats.get("ratio_max", 1.0),
            "n_completion_tokens": lengths[r],
            "correct": bool(rewards.verifier[r] > 0),
            "truncated": out.truncated[r],
        }
        for r in range(len(batch))
    ]
