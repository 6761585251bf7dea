"""The GRPO stage of iteration k: M steps of online sampling -> reward -> advantages -> update.

policy_k is both the starting point and the frozen reference (reference := policy). The
stage checkpoints weights, optimizer, RNG and the step cursor every `checkpoint_every`
steps; a rerun resumes from there, and the rows of finished steps travel with the
checkpoint so the committed `policy_samples` hold every step exactly once.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from transformers import PreTrainedTokenizerBase

from flows.config import ItergrpoConfig
from flows.engines.policy_updaters import PolicyUpdater, build_policy_updater
from flows.engines.sampling import GRPOSampler
from flows.interrupts import INTERRUPT
from flows.model_io import policy_at, save_model, to_device
from flows.names import GRPO, GRPO_PROGRESS, ORM, POLICY, PRM, TRAIN_SPLIT
from flows.progress import ProgressFn, log
from flows.stage_io import (
    StageResult,
    ckpt,
    derive_seed,
    metric_rows,
    require_checkpoint,
    resolve_device,
)
from grpo_core.algo.advantages import (
    AdvantageInputs,
    get_adv_estimator,
    pad_steps,
    zero_advantage_group_fraction,
)
from grpo_core.algo.numerics import DIVERGED, REWARD_SOURCE, require_finite, require_finite_metrics
from grpo_core.data.answers import format_reward
from grpo_core.data.policy_batch import build_policy_batch
from grpo_core.data.reasoning_steps import step_end_token_indices
from grpo_core.data.tasks.base import Problem, Task
from grpo_core.data.tasks.registry import make_task
from grpo_core.engines.rollout_types import RolloutBatch, SamplingParams
from grpo_core.model.policy import format_prompt, load_policy
from reward_models.models import RewardModel
from reward_models.scoring import aggregate_step_scores, score_outcome, score_steps
from storage.checkpoints import (
    capture_rng_state,
    load_training_state,
    restore_rng_state,
    save_checkpoint,
    save_training_state,
)
from storage.store import RunWriter

SAMPLES_FILE = "policy_samples.parquet"
METRICS_FILE = "metrics.parquet"


@dataclass
class StepRewards:
    """Rewards of one GRPO step's P x G outputs (flattened prompt-major)."""

    total: torch.Tensor  # (B,) weighted outcome reward (under PS: added to the last step)
    verifier: torch.Tensor  # (B,) 1/0, always computed: the over-optimisation yardstick
    fmt: torch.Tensor  # (B,) 1/0
    rm: torch.Tensor | None  # (B,) what the learned RMs gave each output (None: no RM used)
    step_scores: list[list[float]] | None  # per-step rewards (process supervision)
    step_ends: list[list[int]] | None  # index into the policy's completion tokens per step

    @property
    def per_output(self) -> torch.Tensor:
        """The reward each output received: the outcome reward, plus under process supervision
        its mean PRM step score (the step rewards without the outcome part)."""
        if self.step_scores is None or self.rm is None:
            return self.total
        return self.total + self.rm


def compute_rewards(
    cfg: ItergrpoConfig,
    task: Task,
    problems: list[Problem],
    prompts: list[str],
    batch: RolloutBatch,
    policy_tokenizer: PreTrainedTokenizerBase,
    orm: RewardModel | None,
    prm: RewardModel | None,
) -> StepRewards:
    """Weighted verifier + format + ORM + PRM-outcome reward; PRM step rewards under PS.

    Step boundaries under process supervision come from the policy's own sampled tokens; the
    PRM reads each step at its own tokenization of the same text, so the two may differ.
    """
    weights = cfg.grpo.rewards
    owners = [problems[i] for i in batch.prompt_index]
    row_prompts = [prompts[i] for i in batch.prompt_index]
    verifier = torch.tensor(
        [float(task.is_correct(p, t)) for p, t in zip(owners, batch.texts, strict=True)]
    )
    fmt = torch.tensor([format_reward(t) for t in batch.texts])
    total = weights.verifier * verifier + weights.format * fmt
    learned: list[tuple[float, torch.Tensor]] = []  # (weight, score) of each learned part
    if orm is not None and weights.orm > 0:
        orm_scores = score_outcome(orm, orm.tokenizer, row_prompts, batch.texts).float().cpu()
        learned.append((weights.orm, orm_scores))
    scored = score_steps(prm, prm.tokenizer, row_prompts, batch.texts) if prm is not None else None
    if scored is not None and weights.prm > 0:
        learned.append((weights.prm, aggregate_step_scores(scored.scores, weights.prm_aggregation)))
    for weight, score in learned:
        total = total + weight * score
    rm = None
    if learned:  # the weighted mean of the learned parts: what the RMs said of each output
        rm = torch.stack([w * s for w, s in learned]).sum(0) / sum(w for w, _ in learned)
    if cfg.grpo.algo.supervision != "process":
        return StepRewards(total, verifier, fmt, rm, None, None)
    assert scored is not None  # the config validator requires a PRM under process supervision
    step_ends = [step_end_token_indices(ids, policy_tokenizer) for ids in batch.completion_ids]
    for r, (scores, ends) in enumerate(zip(scored.scores, step_ends, strict=True)):
        if len(scores) != len(ends):
            raise ValueError(
                f"GRPO output {r}: the PRM found {len(scores)} steps but the policy's tokens "
                f"{len(ends)}; the two tokenizers decode {batch.texts[r]!r} differently"
            )
    # The outcome part (verifier, format, outcome RMs) is added to the last step, so a
    # process-supervised run can still be anchored to the checked answer.
    step_scores = [
        [*s[:-1], s[-1] + float(extra)] if s else []
        for s, extra in zip(scored.scores, total.tolist(), strict=True)
    ]
    step_mean = torch.tensor([sum(s) / len(s) if s else 0.0 for s in scored.scores])
    return StepRewards(total, verifier, fmt, step_mean, step_scores, step_ends)


def reward_stats(rewards: StepRewards, group_size: int) -> dict[str, float]:
    """Per-step reward metrics: what was used, what the learned RMs gave, what the verifier
    says of the same samples (rm_reward_mean - verifier_accuracy is the over-optimisation gap),
    and the share of groups whose outputs all got the same reward (no outcome gradient)."""
    stats = {
        "reward_mean": float(rewards.per_output.mean()),
        "verifier_accuracy": float(rewards.verifier.mean()),
        "equal_reward_groups": zero_advantage_group_fraction(
            rewards.per_output.reshape(-1, group_size)
        ),
    }
    if rewards.rm is not None:
        stats["rm_reward_mean"] = float(rewards.rm.mean())
    return stats


def token_advantages(
    cfg: ItergrpoConfig, rewards: StepRewards, response_mask: torch.Tensor, shape: tuple[int, int]
) -> torch.Tensor:
    """(B, T) advantages in response coordinates from the configured estimator."""
    algo = cfg.grpo.algo
    inputs = AdvantageInputs(
        response_mask=response_mask,
        rewards=rewards.total.reshape(shape),
        correct=rewards.verifier.reshape(shape),
    )
    if rewards.step_scores is not None and rewards.step_ends is not None:
        step_rewards, step_mask, step_ends = pad_steps(
            rewards.step_scores, rewards.step_ends, shape
        )
        inputs = AdvantageInputs(
            response_mask=response_mask,
            rewards=inputs.rewards,
            correct=inputs.correct,
            step_rewards=step_rewards,
            step_mask=step_mask,
            step_ends=step_ends,
        )
    return get_adv_estimator(algo.advantage_estimator)(inputs, algo.adv_eps)


def _load_rms(
    cfg: ItergrpoConfig, run: RunWriter, k: int, device: torch.device
) -> tuple[RewardModel | None, RewardModel | None]:
    orm = prm = None
    if cfg.grpo.rewards.orm > 0:
        path = require_checkpoint(ckpt(cfg, run.run_id, ORM, k), f"orm_{k}")
        orm = RewardModel.load(path, device=device).eval()
    if cfg.grpo.algo.supervision == "process" or cfg.grpo.rewards.prm > 0:
        path = require_checkpoint(ckpt(cfg, run.run_id, PRM, k), f"prm_{k}")
        prm = RewardModel.load(path, device=device).eval()
    return orm, prm


def check_rewards(rewards: StepRewards, where: str) -> None:
    """Every reward of a step finite, the learned ones named first (the usual culprit)."""
    if rewards.rm is not None:
        require_finite("the reward models' reward", rewards.rm, where=where, cause=REWARD_SOURCE)
    for n, steps in enumerate(rewards.step_scores or []):
        require_finite(f"PRM step rewards of output {n}", steps, where=where, cause=REWARD_SOURCE)
    require_finite("the weighted reward", rewards.total, where=where, cause=REWARD_SOURCE)


def _save_progress(
    path: Path,
    model: Any,
    tokenizer: Any,
    updater: PolicyUpdater,
    next_step: int,
    sample_rows: list[dict[str, Any]],
    metric_log: list[dict[str, Any]],
) -> None:
    def write(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True, state_dict=updater.weights())
        tokenizer.save_pretrained(tmp)
        save_training_state(
            tmp,
            optimizer_state=updater.save_state(tmp),
            rng_state=capture_rng_state(),
            extra={"next_step": next_step},
        )
        pq.write_table(pa.Table.from_pylist(sample_rows), tmp / SAMPLES_FILE)
        pq.write_table(pa.Table.from_pylist(metric_log), tmp / METRICS_FILE)

    save_checkpoint(path, write, overwrite=True)


def _resume_weights(path: Path, model: Any) -> bool:
    """Load the weights of the stage's last progress checkpoint, if there is one.

    Before the engine is built: DeepSpeed copies the weights into its optimizer at start.
    """
    if not (path / "config.json").is_file():
        return False
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(path / "model.safetensors")), strict=False)
    return True


def _resume_point(
    path: Path, updater: PolicyUpdater
) -> tuple[int, list[dict[str, Any]], list[dict[str, Any]]]:
    state = load_training_state(path)
    updater.load_state(path, state["optimizer_state"])
    restore_rng_state(state["rng_state"])
    samples = pq.read_table(path / SAMPLES_FILE).to_pylist()
    metrics = pq.read_table(path / METRICS_FILE).to_pylist()
    log.info("GRPO: resuming at step %d from %s", state["extra"]["next_step"], path)
    return int(state["extra"]["next_step"]), samples, metrics


def grpo_stage(
    cfg: ItergrpoConfig, run: RunWriter, iteration: int, progress: ProgressFn
) -> StageResult:
    """M GRPO steps on policy_k against reference policy_k and rm_k -> policy_{k+1}."""
    g, algo, k = cfg.grpo, cfg.grpo.algo, iteration
    device = resolve_device(cfg)
    task = make_task(cfg.task)
    policy_dir = require_checkpoint(ckpt(cfg, run.run_id, POLICY, k), f"policy_{k}")
    model, tokenizer = policy_at(cfg, run, k)
    reference = None
    if algo.beta > 0:  # beta = 0 never loads the reference (no forward pass, no memory)
        reference = to_device(load_policy(policy_dir)[0], cfg)
        reference.eval().requires_grad_(False)
    orm, prm = _load_rms(cfg, run, k, device)
    progress_dir = ckpt(cfg, run.run_id, GRPO_PROGRESS, k)
    resumed = _resume_weights(progress_dir, model)
    updater = build_policy_updater(cfg, run, k, model, reference, policy_dir, device)
    start = 0
    sample_rows: list[dict[str, Any]] = []
    metric_log: list[dict[str, Any]] = []
    if resumed:
        start, sample_rows, metric_log = _resume_point(progress_dir, updater)
    sampler = GRPOSampler(cfg, run, k, model, tokenizer, updater.weights)
    if resumed:
        sampler.weights_changed()
    try:
        pool = task.problems(
            TRAIN_SPLIT, g.steps * g.prompts_per_step, seed=derive_seed(cfg.run.seed, GRPO, k)
        )
        params = SamplingParams(max_new_tokens=g.max_new_tokens, temperature=algo.temperature)
        for step in range(start, g.steps):
            problems = pool[step * g.prompts_per_step : (step + 1) * g.prompts_per_step]
            prompts = [format_prompt(tokenizer, p.question) for p in problems]
            step_seed = derive_seed(cfg.run.seed, GRPO, k, step)
            model.eval()
            batch = sampler.generate(prompts, g.group_size, params, seed=step_seed)
            where = f"GRPO iteration {k}, step {step}"
            require_finite(
                "the policy's sampling log-probs",
                [lp for row in batch.logprobs for lp in row],
                where=where,
                cause=DIVERGED,
            )
            rewards = compute_rewards(cfg, task, problems, prompts, batch, tokenizer, orm, prm)
            check_rewards(rewards, where)
            shape = (len(problems), g.group_size)
            # Advantages are computed on the CPU in response coordinates, then placed at the
            # completion columns of the padded batch (B, L) the update consumes.
            cpu_batch = build_policy_batch(
                batch.prompt_ids, batch.completion_ids, tokenizer.pad_token_id
            )
            response_mask = cpu_batch.full_to_response(cpu_batch.response_mask)
            advantages = token_advantages(cfg, rewards, response_mask, shape)
            require_finite("advantages", advantages, where=where, cause=REWARD_SOURCE)
            old = (
                cpu_batch.lists_to_full(batch.logprobs)
                if algo.use_sampling_logprobs_as_old
                else None
            )
            stats = updater.update(
                cpu_batch, cpu_batch.response_to_full(advantages), old, step_seed
            )
            sampler.weights_changed()
            stats.update(reward_stats(rewards, g.group_size))
            require_finite_metrics(stats, where=where, cause=DIVERGED)
            metric_log += metric_rows(GRPO, stats, step)
            sample_rows += _sample_rows(
                step, problems, batch, rewards, advantages, stats, g.group_size
            )
            progress(
                (step + 1) / g.steps,
                f"GRPO step {step + 1}/{g.steps}: reward {stats['reward_mean']:.3f}",
            )
            log.info(
                "GRPO iter %d step %d: reward %.3f (RM %.3f) verifier acc %.3f kl %.4f",
                k,
                step,
                stats["reward_mean"],
                stats.get("rm_reward_mean", float("nan")),
                stats["verifier_accuracy"],
                stats.get("kl", float("nan")),
            )
            done = step + 1
            if done % g.checkpoint_every == 0 or done == g.steps or INTERRUPT.requested:
                _save_progress(
                    progress_dir, model, tokenizer, updater, done, sample_rows, metric_log
                )
            INTERRUPT.check()
        save_model(ckpt(cfg, run.run_id, POLICY, k + 1), model, tokenizer, updater.weights())
    finally:
        sampler.close()
        updater.close()
    with run.stage(k, GRPO) as attempt:
        attempt.write("policy_samples", sample_rows)
        attempt.write("metrics", metric_log)
    summary = {
        name: sum(r["value"] for r in metric_log if r["name"] == name) / max(g.steps, 1)
        for name in ("reward_mean", "rm_reward_mean", "verifier_accuracy", "kl")
        if any(r["name"] == name for r in metric_log)
    }
    return StageResult(GRPO, k, metrics=summary)


def _sample_rows(
    step: int,
    problems: list[Problem],
    batch: RolloutBatch,
    rewards: StepRewards,
    advantages: torch.Tensor,
    stats: dict[str, float],
    group_size: int,
) -> list[dict[str, Any]]:
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
            "reward_verifier": float(rewards.verifier[r]),
            "reward_rm": None if rewards.rm is None else float(rewards.rm[r]),
            "reward_format": float(rewards.fmt[r]),
            "advantage": seq_adv[r],
            "kl": stats.get("kl", 0.0),
            "ratio_mean": stats.get("ratio_mean", 1.0),
            "ratio_max": stats.get("ratio_max", 1.0),
            "n_completion_tokens": lengths[r],
            "correct": bool(rewards.verifier[r] > 0),
        }
        for r in range(len(batch))
    ]
