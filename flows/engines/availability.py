"""Whether the engines a config selects are installed here: checked before any stage runs,
with the field to change and the fix in the error."""

from __future__ import annotations

import os
import sys
from importlib.util import find_spec
from pathlib import Path

from flows.config import ItergrpoConfig
from flows.errors import ConfigError


def require_deepspeed() -> None:
    """A ConfigError naming the extra to install unless deepspeed is importable here."""
    if find_spec("deepspeed") is None:
        raise ConfigError(
            "engines.train = deepspeed, but deepspeed is not installed in this environment "
            f"({sys.executable}): install the gpu extra (pip install -e '.[gpu]'; `make venv` "
            "does), or set engines.train: torch"
        )


def vllm_python_path(cfg: ItergrpoConfig) -> Path:
    """The vLLM environment's python, or a ConfigError naming the field and the fix."""
    from grpo_core.engines.vllm_rollout import DEFAULT_VLLM_PYTHON, PYTHON_ENV_VAR

    python = cfg.engines.vllm.python or os.environ.get(PYTHON_ENV_VAR) or DEFAULT_VLLM_PYTHON
    path = Path(python).expanduser()
    if not path.is_file():
        raise ConfigError(
            f"engines.rollout = vllm, but the vLLM environment's python {path} does not exist: "
            "run `make vllm-env` in the repository root, set engines.vllm.python (or "
            f"${PYTHON_ENV_VAR}) to a python with vllm installed, or set engines.rollout: hf"
        )
    return path


def check_engines(cfg: ItergrpoConfig) -> None:
    """Fail before any stage runs when a selected engine is not installed here."""
    if cfg.engines.train == "deepspeed":
        require_deepspeed()
    if cfg.engines.rollout == "vllm":
        vllm_python_path(cfg)
