"""Importing deepspeed the quiet way, for the DeepSpeed engine and for every process that
saves a transformers model.

transformers' `save_pretrained` unwraps the model through accelerate, which imports deepspeed
whenever it is installed (to recognise a DeepSpeedEngine). A plain `import deepspeed` imports
mlflow for its autotuner and logs a line picking the accelerator: 2.3 s more than the import
below in each process (measured: 2.85 s against 0.5 s on the 2-core CI machine), paid by every
CLI run, Ray rank and launcher job that writes a checkpoint.
"""

from __future__ import annotations

import os
import sys
from importlib.util import find_spec
from types import ModuleType

import torch

# DeepSpeed's shared-memory all-reduce op serves DeepSpeed inference only; on a CPU machine
# building it compiles C++ for 30-130 s on first start, so training runs skip it.
CPU_SHM_OP = "deepspeed_shm_comm"


def import_deepspeed() -> ModuleType:
    """deepspeed, with the accelerator pinned (cuda when torch sees a GPU, else cpu)."""
    os.environ.setdefault("DS_ACCELERATOR", "cuda" if torch.cuda.is_available() else "cpu")
    # deepspeed's autotuner imports mlflow at import time, only to log autotuning experiments
    # (never run here). A None entry makes that import fail, which deepspeed treats as "no
    # mlflow"; removed again afterwards, so the process can still import mlflow itself.
    hide_mlflow = "mlflow" not in sys.modules
    if hide_mlflow:
        sys.modules["mlflow"] = None  # type: ignore[assignment]
    try:
        import deepspeed
    except ImportError as err:
        raise ImportError(
            f"the DeepSpeed engine needs the `gpu` extra: pip install -e '.[gpu]' ({err})"
        ) from err
    finally:
        if hide_mlflow:
            del sys.modules["mlflow"]
    if os.environ["DS_ACCELERATOR"] == "cpu":
        deepspeed.ops.__compatible_ops__[CPU_SHM_OP] = False
    return deepspeed


def import_deepspeed_if_installed() -> None:
    """Import deepspeed the quiet way now when it is installed and not yet imported, so that
    the import inside `save_pretrained` finds it loaded. Nothing without the `gpu` extra."""
    if "deepspeed" not in sys.modules and find_spec("deepspeed") is not None:
        import_deepspeed()
