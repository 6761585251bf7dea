"""policy.attn_implementation: the check that the attention kernels asked for can run here,
before the run (transformers would fail only when the first stage loads the model)."""

from __future__ import annotations

from importlib.util import find_spec

from grpo_core.contracts.errors import SettingError

# the flash-attention kernels and the module each needs, as transformers looks them up
# (transformers.utils.import_utils is_flash_attn_2_available / is_flash_attn_3_available)
FLASH_MODULES = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}
FLASH_PACKAGES = {"flash_attention_2": "flash-attn", "flash_attention_3": "flash-attn-3"}


def require_attn_implementation(name: str | None, cuda: bool) -> None:
    """Raise SettingError when policy.attn_implementation = `name` cannot run here: a
    flash-attention kernel without CUDA (`cuda`: the run's device is a CUDA device) or without
    its package. The package is located, never imported (it loads CUDA libraries)."""
    if name not in FLASH_MODULES:
        return
    if not cuda:
        raise SettingError(
            f"policy.attn_implementation = {name} runs on CUDA only, and this run's device is "
            "not a CUDA device: set policy.attn_implementation: sdpa (or leave it empty), or "
            "run.device: cuda on a machine with a GPU"
        )
    if find_spec(FLASH_MODULES[name]) is None:
        raise SettingError(
            f"policy.attn_implementation = {name} needs the {FLASH_PACKAGES[name]} package, "
            f"which is not installed here: pip install {FLASH_PACKAGES[name]}, or set "
            "policy.attn_implementation: sdpa"
        )
