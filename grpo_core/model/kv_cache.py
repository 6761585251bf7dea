"""The KV cache's name in a model's forward pass: `cache`, or `past_key_values` before it.

transformers 5.x renamed `past_key_values` to `cache` (the old name warns at every call and
goes in 5.40); the supported range (>=5.0) includes releases that know only the old name, so
the name is read from the model's own signature once per call site.
"""

from __future__ import annotations

import inspect
from typing import Any

from torch import nn

NEW_NAME = "cache"
OLD_NAME = "past_key_values"


def cache_keyword(model: nn.Module) -> str:
    """The keyword `model`'s forward takes its KV cache by (a DeepSpeed engine's inner model's)."""
    inner = getattr(model, "module", model)  # DeepSpeedEngine.forward(*inputs, **kwargs)
    params = inspect.signature(inner.forward).parameters
    return NEW_NAME if NEW_NAME in params else OLD_NAME


def returned_cache(output: Any) -> Any:
    """The KV cache a forward pass returned (None if it returned none), under either name.

    `ModelOutput.get` reads a field without the deprecated-name property's warning.
    """
    cache = output.get(NEW_NAME)
    return cache if cache is not None else output.get(OLD_NAME)
