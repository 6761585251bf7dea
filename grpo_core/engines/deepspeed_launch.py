"""A GRPO update on several processes through the deepspeed launcher, exchanging files.

The caller (e.g. a Prefect task) writes a job directory (job.json + batch.safetensors) with
write_update_job, runs run_update_job (the launcher as a subprocess, its output streamed
line by line to a callback) and reads back the updated policy (HF save_pretrained layout)
and metrics.json. Every rank runs `python -m grpo_core.engines.deepspeed_launch JOB_DIR`.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import torch
from pydantic import BaseModel, ConfigDict, Field
from safetensors.torch import load_file, save_file
from torch import Tensor

from grpo_core.algo.config import GRPOConfig
from grpo_core.contracts.policy_batch import PolicyBatch, update_inputs, update_tensors
from grpo_core.engines.config import DeepSpeedConfig
from grpo_core.model.config import AttnImplementation, ModelDtype
from grpo_core.model.policy import DTYPES, attention_kwargs

log = logging.getLogger(__name__)

JOB_FILE = "job.json"
BATCH_FILE = "batch.safetensors"
METRICS_FILE = "metrics.json"
POLICY_DIR = "policy"
STATE_DIR = "state"
# Set per rank by the launcher; inherited values (e.g. from an in-process engine) would clash.
_LAUNCHER_SETS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class UpdateJob(BaseModel):
    """One grpo_update to run under the launcher: inputs, settings and where outputs go."""

    model_config = ConfigDict(extra="forbid")

    policy_dir: str = Field(description="HF model directory (save_pretrained) of the policy.")
    reference_dir: str | None = Field(
        default=None,
        description="HF model directory of the reference; needed when the loss reads it.",
    )
    output_dir: str = Field(
        description="Written by rank 0: policy/ (updated weights), metrics.json last; "
        "state/ (DeepSpeed checkpoint of all ranks) when save_state."
    )
    grpo: GRPOConfig = Field(default_factory=GRPOConfig, description="Update settings.")
    deepspeed: DeepSpeedConfig = Field(
        default_factory=DeepSpeedConfig, description="ZeRO stage, bf16, processes."
    )
    total_steps: int | None = Field(
        default=None, ge=1, description="Optimizer steps of the whole run (cosine schedule)."
    )
    seed: int = Field(default=0, description="Seeds the row shuffling, identically on all ranks.")
    policy_dtype: ModelDtype = Field(
        default="float32",
        description="The policy's dtype (policy.dtype): the ranks load it so (bf16-mixed: "
        "float32, forward passes under bfloat16 autocast).",
    )
    attn_implementation: AttnImplementation | None = Field(
        default=None,
        description="policy.attn_implementation: the ranks load the policy and the reference "
        "with it (empty: the model's default).",
    )
    resume_from: str | None = Field(
        default=None, description="A state/ directory of an earlier job to continue from."
    )
    save_state: bool = Field(
        default=False, description="Save optimizer + schedule state (state/) for a next job."
    )


def write_update_job(
    job_dir: Path,
    job: UpdateJob,
    batch: PolicyBatch,
    advantages: Tensor,
    old_logprobs: Tensor | None = None,
) -> Path:
    """job.json and batch.safetensors (CPU tensors) in job_dir; returns job_dir."""
    job_dir.mkdir(parents=True, exist_ok=True)
    save_file(update_tensors(batch, advantages, old_logprobs), job_dir / BATCH_FILE)
    (job_dir / JOB_FILE).write_text(job.model_dump_json(indent=2))
    return job_dir


def launcher_command(
    job_dir: Path, cfg: DeepSpeedConfig, python: str = sys.executable
) -> list[str]:
    """The deepspeed launcher command line running this module on every rank."""
    command = [python, "-m", "deepspeed.launcher.runner"]
    if cfg.hostfile is not None:
        command += ["--hostfile", cfg.hostfile]
    command += [
        "--num_gpus",
        str(cfg.processes_per_node),
        "--master_port",
        str(cfg.master_port),
        "--no_local_rank",
        "--module",
        __name__,
        str(job_dir),
    ]
    return command


def run_update_job(
    job_dir: Path,
    cfg: DeepSpeedConfig,
    on_line: Callable[[str], None] = log.info,
    env: dict[str, str] | None = None,
) -> dict[str, float]:
    """Run the job under the launcher, each output line to on_line; the update's metrics."""
    job = UpdateJob.model_validate_json((job_dir / JOB_FILE).read_text())
    child_env = {k: v for k, v in os.environ.items() if k not in _LAUNCHER_SETS}
    child_env.update(env or {})
    if not torch.cuda.is_available():
        child_env.setdefault("DS_ACCELERATOR", "cpu")
    metrics_path = Path(job.output_dir) / METRICS_FILE
    metrics_path.unlink(missing_ok=True)  # its presence marks this run's success
    tail: collections.deque[str] = collections.deque(maxlen=40)
    with subprocess.Popen(
        launcher_command(job_dir, cfg),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=child_env,
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail.append(line.rstrip())
            on_line(line.rstrip())
    if proc.returncode != 0 or not metrics_path.is_file():
        raise RuntimeError(
            f"deepspeed launcher exited with {proc.returncode} for job {job_dir} "
            f"(metrics.json {'present' if metrics_path.is_file() else 'missing'}); last lines:\n"
            + "\n".join(tail)
        )
    metrics: dict[str, float] = json.loads(metrics_path.read_text())
    return metrics


def main(argv: list[str] | None = None) -> None:
    """One rank of a launched job: load, DeepSpeed grpo_update, rank 0 writes the outputs."""
    from transformers import AutoModelForCausalLM

    from grpo_core.algo.update import grpo_update
    from grpo_core.engines.deepspeed_engine import DeepSpeedEngine
    from grpo_core.engines.train import with_policy_precision

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job_dir", type=Path)
    job_dir = parser.parse_args(argv).job_dir
    job = UpdateJob.model_validate_json((job_dir / JOB_FILE).read_text())
    g = job.grpo
    dtype = DTYPES[job.policy_dtype]
    torch.manual_seed(job.seed)
    attention = attention_kwargs(job.attn_implementation)
    model = AutoModelForCausalLM.from_pretrained(job.policy_dir, dtype=dtype, **attention)
    optim = with_policy_precision(g.optimizer_settings(job.total_steps), job.policy_dtype)
    engine = DeepSpeedEngine(model, optim, job.deepspeed)
    if job.resume_from is not None:
        engine.load_checkpoint(Path(job.resume_from))
    reference: torch.nn.Module | None = None
    if g.loss_reads_reference:
        if job.reference_dir is None:
            raise ValueError(f"the loss reads pi_ref: needs reference_dir in {job_dir / JOB_FILE}")
        ref_dtype = torch.bfloat16 if job.deepspeed.bf16 else dtype  # DeepSpeed computes in it
        reference = AutoModelForCausalLM.from_pretrained(
            job.reference_dir, dtype=ref_dtype, **attention
        )
        torch.nn.Module.to(reference, engine.device).eval().requires_grad_(False)
    batch, advantages, old_logprobs = update_inputs(load_file(job_dir / BATCH_FILE), engine.device)
    metrics = grpo_update(
        engine,
        reference,
        batch,
        advantages,
        g,
        old_logprobs=old_logprobs,
        generator=torch.Generator().manual_seed(job.seed),
    )
    output = Path(job.output_dir)
    if job.save_state:
        engine.save_checkpoint(output / STATE_DIR)
    weights = engine.full_state_dict()  # collective under ZeRO-3
    if engine.data_parallel_rank == 0:
        engine.engine.module.save_pretrained(output / POLICY_DIR, state_dict=weights)
        metrics["data_parallel_size"] = float(engine.data_parallel_size)
        partial_metrics = output / f"{METRICS_FILE}.partial"
        partial_metrics.write_text(json.dumps(metrics, indent=2, sort_keys=True))
        partial_metrics.replace(output / METRICS_FILE)  # metrics.json last, whole or absent
    if torch.distributed.is_initialized():
        # Left to interpreter exit, gloo's threads can be torn down while a peer still talks
        # to them ("terminate called without an active exception", exit -6 after a complete
        # update): every rank waits for the others, then closes the group itself.
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
