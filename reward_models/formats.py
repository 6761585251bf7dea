"""Reward-model formats, registered by name: what a checkpoint must be (its architecture, its
head, the tokens it reads) and how its logits become a score. `reward_models.<orm|prm>.format`
names one; `tokens` sets its token strings. Declarations are torch-free (the config reads
them when it loads); `logits` names the torch function by import path (reward_models/heads.py).

Every format scores a position with one binary logit z, the probability being sigmoid(z): a
one-logit head's logit, or the difference of two logits (good - bad next-token logits at a
step tag, positive - negative class at a separator), since softmax over two logits is the
sigmoid of their difference. So one BCE-with-logits loss trains all of them.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from grpo_core.contracts.errors import SettingError
from grpo_core.contracts.registry import Registry

# Class-name endings of transformers models, by the head they carry.
CLASSIFIERS = ("ForSequenceClassification", "ForTokenClassification")
CAUSAL_LM = ("ForCausalLM", "LMHeadModel")


@dataclass(frozen=True)
class TokenSetting:
    """A string a format reads or writes in the RM's own tokenizer.

    marker: inserted after each step's last character (a step tag or separator), the RM read
    at the token that holds it; otherwise a token whose logit is read, which must be exactly
    one token of the RM's tokenizer.
    """

    default: str
    description: str
    marker: bool = False


@dataclass(frozen=True)
class RMFormat:
    """A registered reward-model format.

    architectures: class-name endings the checkpoint's `architectures` must have; empty: any
    backbone, under a new head. num_labels: the classifier head's outputs, None for none.
    new_head: a fresh one-logit head is put on the source's backbone (its own head, if any,
    is dropped). from_policy: the policy checkpoint may be its source. logits: import path of
    `f(net, input_ids, attention_mask, position_ids, read_ids) -> (B, L)` binary logits, with
    read_ids the ids of the non-marker tokens in declaration order.
    """

    name: str
    description: str
    logits: str | Callable[..., Any]
    architectures: tuple[str, ...] = ()
    num_labels: int | None = None
    new_head: bool = False
    from_policy: bool = False
    tokens: Mapping[str, TokenSetting] = field(default_factory=dict)

    def logits_function(self) -> Callable[..., Any]:
        """The torch function of `logits` (imported on first use when given by path)."""
        if not isinstance(self.logits, str):
            return self.logits
        module, _, name = self.logits.partition(":")
        fn: Callable[..., Any] = getattr(importlib.import_module(module), name)
        return fn

    def accepts(self, architecture: str, num_labels: int) -> bool:
        """Whether a pretrained checkpoint of this class and head fits the format as it is."""
        if self.new_head:
            return not architecture.endswith(CLASSIFIERS)
        fits_labels = self.num_labels is None or self.num_labels == num_labels
        return architecture.endswith(self.architectures) and fits_labels

    @property
    def marker(self) -> str | None:
        """The name of the token setting inserted after each step, if the format has one."""
        return next((name for name, t in self.tokens.items() if t.marker), None)

    @property
    def read_tokens(self) -> tuple[str, ...]:
        """The names of the settings whose token logits are read, in declaration order."""
        return tuple(name for name, t in self.tokens.items() if not t.marker)

    def resolved_tokens(self, given: Mapping[str, str]) -> dict[str, str]:
        """Every token setting of this format: `given`, else its default. A name the format
        does not read, an empty string, or a marker ending in whitespace is a SettingError."""
        unknown = sorted(set(given) - set(self.tokens))
        if unknown:
            reads = f"reads {sorted(self.tokens)}" if self.tokens else "reads no tokens"
            raise SettingError(
                f"tokens.{unknown[0]} is not a setting of format {self.name}, which {reads}: "
                "drop it, or choose the format it belongs to"
            )
        out = {name: given.get(name, t.default) for name, t in self.tokens.items()}
        for name, value in out.items():
            if not value.strip():
                raise SettingError(
                    f"tokens.{name} of format {self.name} is empty or blank ({value!r}): give "
                    f"the string, e.g. the default {self.tokens[name].default!r}"
                )
            if self.tokens[name].marker and value != value.rstrip():
                raise SettingError(
                    f"tokens.{name} = {value!r} ends in whitespace: the RM reads the token "
                    "holding the marker's last character, so end it with a visible one"
                )
        return out


RM_FORMATS: Registry[RMFormat] = Registry("reward-model format")


def register_rm_format(fmt: RMFormat) -> RMFormat:
    """Register `fmt`; `reward_models.<orm|prm>.format` may then name it."""
    return RM_FORMATS.add(fmt.name, fmt)


_HEADS = "reward_models.heads"

SCALAR_HEAD = register_rm_format(
    RMFormat(
        name="scalar_head",
        description="the built-in reward model: the source's backbone (the policy's by "
        "default) under a new one-logit token head; score sigmoid(logit) at the last token "
        "(outcome) or at each step's last token (steps)",
        logits=f"{_HEADS}:scalar_logits",
        new_head=True,
        from_policy=True,
    )
)
register_rm_format(
    RMFormat(
        name="classifier",
        description="a pretrained sequence- or token-classification checkpoint with a "
        "one-logit head (num_labels 1), read per token like scalar_head",
        logits=f"{_HEADS}:scalar_logits",
        architectures=CLASSIFIERS,
        num_labels=1,
    )
)
register_rm_format(
    RMFormat(
        name="step_tag",
        description="a step-tag PRM (Math-Shepherd): a causal LM read at a tag written after "
        "each step; score softmax over its next-token logits for the good and bad tokens",
        logits=f"{_HEADS}:good_vs_bad_logits",
        architectures=CAUSAL_LM,
        from_policy=True,
        tokens={
            "tag": TokenSetting(
                " ки", "Step tag written after each step's last character", marker=True
            ),
            "good": TokenSetting("+", "Token whose next-token probability means a good step"),
            "bad": TokenSetting("-", "Token whose next-token probability means a bad step"),
        },
    )
)
register_rm_format(
    RMFormat(
        name="two_class",
        description="a step-separator PRM (Qwen's math PRMs): a classifier with a two-class "
        "head (num_labels 2) read at a separator written after each step; score the softmax "
        "probability of class 1",
        logits=f"{_HEADS}:positive_class_logits",
        architectures=CLASSIFIERS,
        num_labels=2,
        tokens={
            "separator": TokenSetting(
                "<extra_0>", "Separator written after each step's last character", marker=True
            )
        },
    )
)
