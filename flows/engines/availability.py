"""Whether the engines a config selects can run here: each registered engine's own check
(grpo_core/engines/registry.py), and the policy's attention kernels, run before any stage,
with the field and the fix named."""

from __future__ import annotations

from importlib.util import find_spec

from flows.engines_config import EnginesSection
from grpo_core.contracts.errors import SettingError
from grpo_core.engines.registry import ROLLOUT_ENGINES, TRAIN_ENGINES
from grpo_core.model.attention import require_attn_implementation
from grpo_core.model.config import PolicyConfig


def check_engines(engines: EnginesSection) -> None:
    """Fail before any stage runs when a selected engine is not installed here."""
    TRAIN_ENGINES[engines.train].requires(engines.settings_of(engines.train))
    ROLLOUT_ENGINES[engines.rollout].requires(engines.settings_of(engines.rollout))
    if engines.train_workers == "ray" and find_spec("ray") is None:
        raise SettingError(
            "engines.train_workers = ray, but ray is not installed in this environment: "
            "pip install -e '.[ray]' (`make venv` does), or set engines.train_workers: none"
        )


def check_attention(policy: PolicyConfig, device: str) -> None:
    """Fail before any stage runs when policy.attn_implementation cannot run on run.device
    (flash attention without CUDA or without its package)."""
    if policy.attn_implementation is None:
        return
    from flows.runtime import resolve_device

    cuda = resolve_device(device).type == "cuda"
    require_attn_implementation(policy.attn_implementation, cuda)
