"""The KV cache passed and read under the name the installed transformers uses, silently."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

from grpo_core.model.kv_cache import cache_keyword, returned_cache
from tests.models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class OldStyleModel(nn.Module):
    """A model whose forward knows only the name transformers used before the rename."""

    def forward(self, input_ids: torch.Tensor, past_key_values: object = None) -> None:
        return None


class EngineWrapper(nn.Module):
    """DeepSpeedEngine's shape: forward(*inputs, **kwargs) around `.module`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, *inputs: object, **kwargs: object) -> object:
        return self.module(*inputs, **kwargs)


def test_the_keyword_is_read_from_the_models_own_signature() -> None:
    assert cache_keyword(tiny_llama()) == "cache"  # the installed transformers (5.24)
    assert cache_keyword(OldStyleModel()) == "past_key_values"
    assert cache_keyword(EngineWrapper(OldStyleModel())) == "past_key_values"
    assert cache_keyword(EngineWrapper(tiny_llama())) == "cache"


def test_decoding_with_the_returned_cache_matches_a_full_pass_without_a_warning() -> None:
    model = tiny_llama().eval()
    ids = torch.tensor([[1, 5, 7, 3, 9]])
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error")  # a FutureWarning (deprecated keyword) fails here
        full = model(input_ids=ids, use_cache=False).logits[:, -1]
        prefix = model(input_ids=ids[:, :-1], use_cache=True)
        cache = returned_cache(prefix)
        assert cache is not None
        step = model(input_ids=ids[:, -1:], use_cache=True, **{cache_keyword(model): cache})
    torch.testing.assert_close(step.logits[:, -1], full)
    assert returned_cache(step) is cache  # the same cache object, extended in place
