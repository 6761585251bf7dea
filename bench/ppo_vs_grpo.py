"""What the critic costs: peak memory and seconds per step of PPO against GRPO on the same model.

    OMP_NUM_THREADS=2 python bench/ppo_vs_grpo.py --config tiny
    python bench/ppo_vs_grpo.py --config small --device cuda --steps 5

The seeds' claim is that GRPO saves "the memory and compute of a value model as large as the
policy". Each arm runs in its own process (so peak memory is its own) on the same saved
seeded Llama and prompts: 1 warm-up + `--steps` timed steps of 8 prompts x G = 8, temperature
1, mu 1, as the GRPO stage runs them (grpo_step, torch engine, HF sampling). GRPO: the
`paper` preset (beta 0.04 in the loss). PPO: the `ppo` preset (the same 0.04 as KL penalty
in the reward, a critic from the policy's backbone). Both run the reference model. Peak
memory: max RSS on CPU, torch.cuda.max_memory_allocated on a GPU; training state: the bytes
of every model's parameters and gradients and the optimizers' moments. The machine-speed
reference (bench/machine_speed.py) is printed beside the CPU figures.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpo_bench_common as common
import torch
from bench_models import save_bench_policy
from torch import Tensor, nn

from flows.config import GRPOStageSection
from grpo_core.algo.config import GRPOConfig
from grpo_core.algo.critic_update import CriticLearner, critic_optimizer_settings
from grpo_core.algo.estimators import VERIFIER
from grpo_core.algo.rewards import StepRewards
from grpo_core.algo.step import grpo_step, step_parts
from grpo_core.algo.update import grpo_update
from grpo_core.contracts.policy_batch import PolicyBatch
from grpo_core.contracts.rollout import RolloutBatch
from grpo_core.engines.hf_rollout import HFRolloutEngine
from grpo_core.engines.train import TorchEngine
from grpo_core.model.critic import ValueModel
from grpo_core.model.policy import load_policy

MARK = "BENCH_JSON "
ARMS = {"grpo": "paper", "ppo": "ppo"}  # arm -> grpo.preset


class Update:
    """grpo_update on a torch engine, seeded as the stage's in-process updater seeds it."""

    def __init__(self, engine: TorchEngine, reference: nn.Module, algo: GRPOConfig) -> None:
        self.engine, self.reference, self.algo = engine, reference, algo

    def update(
        self, batch: PolicyBatch, advantages: Tensor, old_logprobs: Tensor | None, seed: int
    ) -> dict[str, float]:
        dev = self.engine.model.device
        generator = torch.Generator().manual_seed(seed)
        return grpo_update(
            self.engine,
            self.reference,
            batch.to(dev),
            advantages.to(dev),
            self.algo,
            None,
            generator,
        )


def arith_rewards(prompts: list[str], batch: RolloutBatch) -> StepRewards:
    """grpo_step.py's partial-credit arithmetic reward, the same for both arms."""
    owners = [prompts[i] for i in batch.prompt_index]
    score = torch.tensor(
        [common.arith_reward(q, t) for q, t in zip(owners, batch.texts, strict=True)]
    )
    return StepRewards(total=score, parts={VERIFIER: score}, rm=None)


def state_mib(models: list[nn.Module], optimizers: list[torch.optim.Optimizer]) -> float:
    """MiB of the arm's training state: every model's parameters, a gradient the size of each
    trainable one (held during the step), and the optimizers' moments; the part of the
    memory the critic adds whatever the allocator does."""
    params = [p for m in models for p in m.parameters()]
    size = sum(p.numel() * p.element_size() * (2 if p.requires_grad else 1) for p in params)
    moments = [v for o in optimizers for st in o.state.values() for v in st.values()]
    size += sum(v.numel() * v.element_size() for v in moments if torch.is_tensor(v))
    return size / 2**20


def run_arm(arm: str, cfg: common.BenchConfig, model_dir: Path, device: str, steps: int) -> dict:
    """`steps` timed steps (after one warm-up) of one arm in this process."""
    torch.manual_seed(0)
    model, tokenizer = load_policy(model_dir)
    model.to(device)
    reference = load_policy(model_dir)[0].eval().requires_grad_(False).to(device)
    algo = GRPOStageSection.model_validate(
        {
            "preset": ARMS[arm],
            "algo": {
                "lr": common.LR,
                "micro_batch_size": common.PROMPTS_PER_STEP * common.GROUP_SIZE,
                "temperature": common.TEMPERATURE,
            },
        }
    ).algo
    engine = TorchEngine(model, algo.optimizer_settings())
    critic = None
    if algo.estimator.needs_values:
        value_model = ValueModel.from_backbone(model_dir).to(device)
        critic_engine = TorchEngine(value_model, critic_optimizer_settings(algo))
        critic = CriticLearner(value_model, critic_engine, model, reference, algo)
    sampler = HFRolloutEngine(model, tokenizer, show_progress=False)
    parts = step_parts(
        sampler,
        Update(engine, reference, algo),
        algo,
        group_size=common.GROUP_SIZE,
        max_new_tokens=cfg.max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        critic=critic,
    )
    prompts = common.make_prompts(cfg)
    seconds: list[float] = []
    for step in range(common.WARMUP_STEPS + steps):
        step_prompts = prompts[(step % common.TIMED_STEPS) * common.PROMPTS_PER_STEP :]
        step_prompts = step_prompts[: common.PROMPTS_PER_STEP]
        if device != "cpu":
            torch.cuda.synchronize()
        start = time.perf_counter()
        reward = functools.partial(arith_rewards, step_prompts)
        out = grpo_step(parts, step_prompts, reward, seed=step)
        if device != "cpu":
            torch.cuda.synchronize()
        if step >= common.WARMUP_STEPS:
            seconds.append(time.perf_counter() - start)
    models: list[nn.Module] = [model, reference]
    optimizers = [engine.optimizer]
    if critic is not None:
        models.append(critic.critic)
        optimizers.append(critic_engine.optimizer)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device != "cpu" else common.peak_rss_mib()
    return {
        "arm": arm,
        "median_s": statistics.median(seconds),
        "seconds": seconds,
        "peak_mib": peak,
        "peak_kind": "cuda max_memory_allocated" if device != "cpu" else "max RSS",
        "state_mib": state_mib(models, optimizers),
        "reward_mean_last": out.stats["reward_mean"],
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
    }


def run_worker(arm: str, cfg: common.BenchConfig, model_dir: Path, device: str, steps: int) -> dict:
    """One arm in a fresh process; its JSON report."""
    cmd = [sys.executable, __file__, "--worker", arm, "--config", cfg.name, "--device", device]
    cmd += ["--steps", str(steps), "--model-dir", str(model_dir)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(MARK)]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stdout[-4000:] + proc.stderr[-4000:])
        raise SystemExit(f"{arm} worker failed (exit {proc.returncode}): {' '.join(cmd)}")
    report: dict[str, Any] = json.loads(lines[-1][len(MARK) :])
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", choices=sorted(common.CONFIGS), default="tiny")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--steps", type=int, default=common.TIMED_STEPS, help="timed steps")
    parser.add_argument("--worker", choices=sorted(ARMS), help=argparse.SUPPRESS)
    parser.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--no-reference", action="store_true", help="skip machine_speed.py")
    args = parser.parse_args()
    cfg = common.CONFIGS[args.config]
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    if args.worker:
        report = run_arm(args.worker, cfg, args.model_dir, args.device, args.steps)
        print(MARK + json.dumps(report))
        return
    with tempfile.TemporaryDirectory() as tmp:
        save_bench_policy(cfg, Path(tmp))
        reports = [run_worker(arm, cfg, Path(tmp), args.device, args.steps) for arm in ARMS]
    print(f"config {cfg.name}: {cfg.as_dict()}, device {args.device}, {args.steps} timed steps")
    print(f"{'arm':<5} {'s/step (median)':>16} {'peak MiB':>10} {'state MiB':>10}  peak is")
    for r in reports:
        print(
            f"{r['arm']:<5} {r['median_s']:>16.3f} {r['peak_mib']:>10.0f} "
            f"{r['state_mib']:>10.1f}  {r['peak_kind']}"
        )
    grpo, ppo = reports
    print(
        f"RESULT ppo/grpo: s/step x{ppo['median_s'] / grpo['median_s']:.2f}, "
        f"peak memory x{ppo['peak_mib'] / grpo['peak_mib']:.2f}, "
        f"training state x{ppo['state_mib'] / grpo['state_mib']:.2f} "
        f"({grpo['params_m']:.1f} M policy parameters)"
    )
    if args.device == "cpu" and not args.no_reference:
        from machine_speed import reference_line

        print(reference_line())


if __name__ == "__main__":
    main()
