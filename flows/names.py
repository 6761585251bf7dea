"""Names a run is made of: its stages, the task splits it draws from, and the roles of its
checkpoints. They appear in the `stages` table, in Parquet file names and in paths."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Final

# Stage names as they appear in the `stages` table and in Parquet file names; each is
# registered with what it declares in flows/stage_table.py.
WARM_START = "warm_start"
ROLLOUT = "rollout"
LABEL = "label"
TRAIN_RM = "train_rm"
GRPO = "grpo"
EVALUATE = "evaluate"
ITERATION_STAGES = (ROLLOUT, LABEL, TRAIN_RM, GRPO, EVALUATE)  # run.stages' default: Algorithm 1
EVAL_SPLIT: Final = "test"  # the held-out split every evaluation (policy and RMs) samples
TRAIN_SPLIT: Final = "train"  # the split rollouts, GRPO and so the reward models draw prompts from

# Checkpoint roles: checkpoints/<run_id>/<role>/iter-<k>/
POLICY = "policy"  # policy/iter-k is the policy that iteration k starts from (and its reference)
ORM: Final = "orm"
PRM: Final = "prm"
# policy-lora/iter-(k+1): the LoRA adapters (PEFT format) the GRPO stage of iteration k trained on
# policy/iter-k; policy/iter-(k+1) holds them merged (grpo.lora)
POLICY_LORA = "policy-lora"
GRPO_PROGRESS = "grpo-progress"  # intra-stage resume point of the GRPO stage of iteration k
CRITIC: Final = "critic"  # critic/iter-k: PPO's value model that iteration k starts from


def default_run_id(preset: str = "run") -> str:
    """`<preset>-<UTC timestamp>`: the run id when none is given."""
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '-', preset)}-{stamp}"
