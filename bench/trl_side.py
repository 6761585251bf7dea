"""TRL's side of `grpo_step.py --vs-trl`: GRPOTrainer on the same model, prompts and reward.

Runs in `.venv-bench` (`make bench-env`); prints its effective settings and one
`BENCH_JSON {...}` line. Every setting whose TRL 1.x default differs from the paper's GRPO
(loss_type, beta, bf16, activation checkpointing, fused AdamW, LR schedule) is set explicitly
so both sides do the same work, and read back from the trainer when training starts (the
optimizer and checkpointing only exist then): it exits with an error unless checkpointing is
off and the optimizer is the one our side builds. --check-only stops right there.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import grpo_bench_common as common
import torch
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback
from trl import GRPOConfig, GRPOTrainer

MARK = "BENCH_JSON "


class StepClock(TrainerCallback):
    """Wall and process CPU time of each optimizer step: between consecutive on_step_end calls
    (the first from on_step_begin), so everything a step does, generation included, counts."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not self.marks:
            self.marks.append((time.perf_counter(), time.process_time()))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.append((time.perf_counter(), time.process_time()))

    def durations(self) -> list[tuple[float, float]]:
        """(wall seconds, CPU seconds) per step."""
        return [(b[0] - a[0], b[1] - a[1]) for a, b in itertools.pairwise(self.marks)]


class SettingsProbe(TrainerCallback):
    """Reads the effective settings at on_train_begin: after train() has built the optimizer
    and applied activation checkpointing, before the first step. stop: raise StopAfterSetup
    there (--check-only)."""

    def __init__(self, trainer: GRPOTrainer, stop: bool) -> None:
        self.trainer = trainer
        self.stop = stop
        self.settings: dict[str, Any] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.settings = effective_settings(self.trainer)
        print(common.format_settings("trl", self.settings), flush=True)
        common.check_settings("trl", self.settings)
        if self.stop:
            raise StopAfterSetup


class StopAfterSetup(Exception):
    """Raised by SettingsProbe under --check-only to leave train() before any step."""


def effective_settings(trainer: GRPOTrainer) -> dict[str, Any]:
    """TRL's settings as its trainer and args objects hold them, in the groups grpo_step.py
    compares with ours (common.MUST_MATCH), plus TRL-only ones under "trl"."""
    args = trainer.args
    checkpointing: dict[str, object] = {
        "args.activation_checkpointing": getattr(args, "activation_checkpointing", None),
        "args.gradient_checkpointing": getattr(args, "gradient_checkpointing", None),
        **common.checkpointing_facts(trainer.model, "model"),
    }
    if trainer.ref_model is not None:
        checkpointing.update(common.checkpointing_facts(trainer.ref_model, "ref_model"))
    return {
        "optimizer": common.optimizer_facts(trainer.optimizer),
        "checkpointing": checkpointing,
        "algorithm": {
            "lr": args.learning_rate,
            "lr_schedule": str(getattr(args.lr_scheduler_type, "value", args.lr_scheduler_type)),
            "max_grad_norm": args.max_grad_norm,
            "beta": trainer.beta,
            "clip_eps": [trainer.epsilon_low, trainer.epsilon_high],
            "mu": trainer.num_iterations,
            "num_generations": trainer.num_generations,
            "prompts_per_step": args.per_device_train_batch_size // trainer.num_generations,
            "max_new_tokens": trainer.max_completion_length,
            "temperature": trainer.temperature,
        },
        "dtype": str(next(trainer.model.parameters()).dtype),
        "threads": common.thread_settings(torch.get_num_threads(), torch.get_num_interop_threads()),
        "versions": common.versions(),
        "trl": {
            "optim": str(getattr(args.optim, "value", args.optim)),
            "loss_type": trainer.loss_type,
            "scale_rewards": trainer.scale_rewards,
            "top_p": trainer.top_p,
            "top_k": trainer.top_k,
            "bf16": args.bf16,
            "fp16": args.fp16,
            "use_vllm": args.use_vllm,
            "gradient_accumulation_steps": args.gradient_accumulation_steps,
            "weight_decay": args.weight_decay,
        },
    }


def matched_config(
    output_dir: str,
    *,
    use_cpu: bool,
    max_steps: int,
    batch: int,
    group_size: int,
    max_new_tokens: int,
    bf16: bool,
) -> GRPOConfig:
    """TRL's GRPOConfig set to do our side's work: the paper's GRPO loss, constant LR, torch's
    AdamW (fused on CUDA, as ours), no checkpointing, no vLLM, nothing shuffled or saved;
    `batch` completions per step, `group_size` per prompt."""
    return GRPOConfig(
        output_dir=output_dir,
        use_cpu=use_cpu,
        max_steps=max_steps,
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=group_size,
        max_completion_length=max_new_tokens,
        temperature=common.TEMPERATURE,
        top_p=1.0,
        top_k=0,
        learning_rate=common.LR,
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        adam_beta1=0.9,
        adam_beta2=0.999,
        max_grad_norm=1.0,
        # torch's AdamW as our engine builds it: fused/foreach unset on CPU, the fused
        # kernel on CUDA (grpo_core/engines/train.py adamw_kernel; TRL's default on torch
        # >= 2.8 is adamw_torch_fused everywhere)
        optim="adamw_torch" if use_cpu else "adamw_torch_fused",
        beta=common.BETA,
        epsilon=common.EPS,
        num_iterations=1,
        loss_type="grpo",  # per-sequence token mean, then mean over sequences (paper)
        scale_rewards="group",
        bf16=bf16,
        fp16=False,
        # the current name: TRL defaults the deprecated alias gradient_checkpointing to True,
        # and the alias only applies while activation_checkpointing is unset
        activation_checkpointing=False,
        use_vllm=False,
        shuffle_dataset=False,
        report_to=[],
        push_to_hub=False,
        save_strategy="no",
        logging_steps=1,
        disable_tqdm=True,
        dataloader_num_workers=0,
        seed=0,
    )


def timed(fn: Any, log: list[float]) -> Any:
    """fn wrapped to append its seconds per call to `log`."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        out = fn(*args, **kwargs)
        log.append(time.perf_counter() - start)
        return out

    return wrapper


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=list(common.CONFIGS), required=True)
    parser.add_argument("--model-dir", type=Path, required=True)
    parser.add_argument("--check-only", action="store_true", help="settings only, no steps")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    cfg = common.CONFIGS[args.config]
    prompts = common.make_prompts(cfg)
    rewards: list[float] = []
    tokens: list[int] = []

    def arith_reward(
        prompts: list[str], completions: list[str], completion_ids: list[list[int]], **_: Any
    ) -> list[float]:
        out = [common.arith_reward(p, c) for p, c in zip(prompts, completions, strict=True)]
        rewards.append(sum(out) / len(out))
        tokens.append(sum(len(ids) for ids in completion_ids))
        return out

    steps = common.WARMUP_STEPS + common.TIMED_STEPS
    batch = common.PROMPTS_PER_STEP * common.GROUP_SIZE
    with tempfile.TemporaryDirectory(prefix="trl-bench-") as out_dir:
        config = matched_config(
            out_dir,
            use_cpu=True,
            max_steps=steps,
            batch=batch,  # completions in TRL 1.x: 8 prompts x 8
            group_size=common.GROUP_SIZE,
            max_new_tokens=cfg.max_new_tokens,
            bf16=False,
        )
        trainer = GRPOTrainer(
            model=str(args.model_dir),
            reward_funcs=arith_reward,
            args=config,
            train_dataset=Dataset.from_dict({"prompt": prompts}),
            processing_class=AutoTokenizer.from_pretrained(args.model_dir),
        )
        probe = SettingsProbe(trainer, stop=args.check_only)
        trainer.add_callback(probe)
        clock = StepClock()
        trainer.add_callback(clock)
        generate_s: list[float] = []
        trainer.model.generate = timed(trainer.model.generate, generate_s)
        ref_s: list[float] = []
        assert trainer.ref_model is not None
        trainer.ref_model.forward = timed(trainer.ref_model.forward, ref_s)
        loss_s: list[float] = []  # policy forward + loss (its backward is outside compute_loss)
        trainer.compute_loss = timed(trainer.compute_loss, loss_s)
        try:
            trainer.train()
        except StopAfterSetup:
            print(MARK + json.dumps({"side": "trl", "settings": probe.settings, "steps": []}))
            return 0
    report = {
        "side": "trl",
        "settings": probe.settings,
        "steps": [
            {
                "seconds": seconds,
                "cpu_seconds": cpu_seconds,
                "generation": generate_s[i],
                "reference": ref_s[i],
                "policy_fwd": loss_s[i],
                "completion_tokens": tokens[i],
                "reward_mean": rewards[i],
            }
            for i, (seconds, cpu_seconds) in enumerate(clock.durations())
        ],
        "peak_rss_mib": common.peak_rss_mib(),
    }
    print(MARK + json.dumps(report))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
