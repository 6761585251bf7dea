"""Gradient checkpointing of a model role (policy, critic, reward model): transformers' own,
non-reentrant, switched on the outermost transformers model inside any wrapper.

transformers 5.x renames gradient_checkpointing_* to activation_checkpointing_* (the old
names warn, and go in 6); the supported range has releases that know only the old names.
"""

from __future__ import annotations

from torch import nn
from transformers import PreTrainedModel


def transformers_model(model: nn.Module) -> PreTrainedModel | None:
    """The outermost transformers model in `model` (itself, or inside a value/reward head,
    LoRA or DDP wrapper); None when it holds none."""
    return next((m for m in model.modules() if isinstance(m, PreTrainedModel)), None)


def set_gradient_checkpointing(model: nn.Module, enabled: bool) -> None:
    """Recompute each decoder layer's activations in backward instead of keeping them
    (transformers' gradient_checkpointing_enable, use_reentrant=False); it applies while the
    model is in train mode. A no-op when the state is already `enabled`."""
    inner = transformers_model(model)
    if inner is None or is_checkpointing(inner) == enabled:
        if enabled and inner is None:
            raise ValueError(
                f"gradient checkpointing needs a transformers model (got {type(model).__name__})"
            )
        return
    if enabled:
        if not inner.supports_gradient_checkpointing:
            raise ValueError(
                f"{type(inner).__name__} does not support gradient checkpointing: set "
                "gradient_checkpointing: false for this model"
            )
        kwargs = {"use_reentrant": False}
        if _has_new_names(inner):
            inner.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            inner.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    elif _has_new_names(inner):
        inner.activation_checkpointing_disable()
    else:
        inner.gradient_checkpointing_disable()


def _has_new_names(model: PreTrainedModel) -> bool:
    return hasattr(type(model), "activation_checkpointing_enable")


def is_checkpointing(model: PreTrainedModel) -> bool:
    """Whether `model` has gradient (activation) checkpointing switched on."""
    if _has_new_names(model):
        return bool(model.is_activation_checkpointing)
    return bool(model.is_gradient_checkpointing)


def recomputes_layers(model: nn.Module) -> bool:
    """True when a forward with grad recomputes layers in backward (checkpointing on, train
    mode): a KV cache passed in would be written a second time by the recompute."""
    inner = transformers_model(model)
    return inner is not None and is_checkpointing(inner) and inner.training
