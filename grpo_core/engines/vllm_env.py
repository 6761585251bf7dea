"""Where the vLLM environment is: vLLM's pins clash with Prefect's, so it lives in its own
virtual environment, whose python the vLLM engine starts its worker with. Torch-free: the
engine registry checks it before any stage runs."""

from __future__ import annotations

import os
from pathlib import Path

from grpo_core.contracts.errors import SettingError

PYTHON_ENV_VAR = "ITERGRPO_VLLM_PYTHON"
# `make vllm-env` builds the environment in the repository root (next to grpo_core/).
DEFAULT_VLLM_PYTHON = Path(__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"


def find_vllm_python(given: str | Path | None = None) -> Path:
    """The vLLM environment's python: `given` (engines.vllm.python), else
    $ITERGRPO_VLLM_PYTHON, else .venv-vllm in the repository; a SettingError naming the
    fields and the fix when it is not there."""
    python = given or os.environ.get(PYTHON_ENV_VAR) or DEFAULT_VLLM_PYTHON
    path = Path(python).expanduser()
    if not path.is_file():
        raise SettingError(
            f"engines.rollout = vllm, but the vLLM environment's python {path} does not exist: "
            "run `make vllm-env` in the repository root, set engines.vllm.python (or "
            f"${PYTHON_ENV_VAR}) to a python with vllm installed, or set engines.rollout: hf"
        )
    return path
