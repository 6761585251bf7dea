"""Where a reward model's network comes from, checked against its format (reward_models/
formats.py): the transformers class of a checkpoint, its head, the ids of the tokens it reads,
and the pre-flight check of a source from its config and tokenizer, without its weights."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    AutoTokenizer,
    PretrainedConfig,
    PreTrainedModel,
)

from grpo_core.contracts.errors import MissingPathError, SettingError
from grpo_core.model.policy import DTYPES, ensure_pad_token, reading_checkpoint
from reward_models.config import ORM_SOURCE, POLICY_SOURCE, RewardModelSettings, RMKind
from reward_models.formats import RM_FORMATS, RMFormat
from reward_models.views import RMEncoder

# The transformers class that loads a checkpoint, by the ending of its architecture's name.
AUTO_CLASSES: dict[str, Any] = {
    "ForSequenceClassification": AutoModelForSequenceClassification,
    "ForTokenClassification": AutoModelForTokenClassification,
    "ForCausalLM": AutoModelForCausalLM,
    "LMHeadModel": AutoModelForCausalLM,  # GPT-2's name for a causal LM
}


def architecture(config: PretrainedConfig) -> str:
    """The checkpoint's model class name (config.architectures), '' when it names none."""
    return str((config.architectures or [""])[0])


def auto_class(config: PretrainedConfig) -> Any:
    """The transformers auto class that loads a checkpoint of this config with its head."""
    arch = architecture(config)
    for ending, cls in AUTO_CLASSES.items():
        if arch.endswith(ending):
            return cls
    raise SettingError(
        f"a reward-model checkpoint of class {arch or '(none named)'} has no head itergrpo can "
        f"read: it must end in one of {list(AUTO_CLASSES)}"
    )


def check_architecture(arch: str, labels: int, spec: RMFormat, where: str, source: str) -> None:
    """Raise SettingError naming `where`.format when a checkpoint of class `arch` with a
    `labels`-output head does not fit the format, with the formats that do fit."""
    if spec.accepts(arch, labels):
        return
    fitting = [n for n, f in RM_FORMATS.items() if not f.new_head and f.accepts(arch, labels)]
    fix = (
        f"set {where}.format: {' or '.join(fitting)}"
        if fitting
        else "give a checkpoint of a class and head the format reads"
    )
    if spec.new_head:
        raise SettingError(
            f"{where}.format is {spec.name}, which puts a new head on a backbone, but "
            f"{where}.source {source} is a {arch} with its own head (num_labels {labels}): "
            f"{fix + ' to read that head' if fitting else 'give its backbone without the head'}"
        )
    if not arch.endswith(spec.architectures):
        wanted = " or ".join(f"*{a}" for a in spec.architectures)
        raise SettingError(
            f"{where}.format is {spec.name}, which reads a {wanted} checkpoint, but "
            f"{where}.source {source} is a {arch or 'model naming no architecture'}: {fix}"
        )
    raise SettingError(
        f"{where}.format is {spec.name}, which reads a head of {spec.num_labels} "
        f"logit{'s' if spec.num_labels != 1 else ''}, but the head of {where}.source {source} "
        f"({arch}) has num_labels {labels}: {fix}"
    )


def check_network(net: nn.Module, spec: RMFormat, where: str) -> None:
    """A built network fits the format: scalar_head's own one-logit token classifier, or a
    class and head the format reads, with the module its logits read: a sequence classifier's
    per-token `score` head, a causal LM's linear output layer."""
    name = type(net).__name__
    labels = int(getattr(net.config, "num_labels", 0))
    if spec.new_head:
        if not (name.endswith("ForTokenClassification") and labels == 1):
            raise ValueError(f"a scalar_head network is a one-logit token classifier, not {name}")
        return
    check_architecture(name, labels, spec, where, f"the {name} network")
    if name.endswith("ForTokenClassification"):
        return
    if name.endswith("ForSequenceClassification"):
        if not isinstance(getattr(net, "score", None), nn.Linear):
            raise SettingError(
                f"{where}.source is a {name} whose head is not a linear `score` layer: itergrpo "
                "reads decoder-style classifiers (Llama, Qwen, Mistral, GPT-2) at every token"
            )
        return
    if not isinstance(net.get_output_embeddings(), nn.Linear):  # type: ignore[operator]
        raise SettingError(f"{where}.source is a {name} without a linear output layer to read")


def read_token_ids(
    tokenizer: Any,
    spec: RMFormat,
    tokens: Mapping[str, str],
    where: str,
    vocab_size: int | None = None,
) -> tuple[int, ...]:
    """The id of each token the format reads a logit of; each must be one token of the RM's
    tokenizer, distinct, and inside the model's vocabulary."""
    ids: list[int] = []
    for name in spec.read_tokens:
        found = list(tokenizer.encode(tokens[name], add_special_tokens=False))
        if len(found) != 1:
            raise SettingError(
                f"{where}.tokens.{name} = {tokens[name]!r} is {len(found)} tokens in the reward "
                "model's tokenizer, not one: its next-token logit is read, so give a string "
                "the tokenizer encodes as a single token"
            )
        if vocab_size is not None and found[0] >= vocab_size:
            raise SettingError(
                f"{where}.tokens.{name} = {tokens[name]!r} is token {found[0]}, outside the "
                f"model's vocabulary of {vocab_size}: the tokenizer does not match the model"
            )
        ids += found
    if len(set(ids)) < len(ids):
        names = ", ".join(f"tokens.{n} = {tokens[n]!r}" for n in spec.read_tokens)
        raise SettingError(f"{where}: {names} are the same token: give distinct ones")
    return tuple(ids)


def marker_encoder(
    tokenizer: Any, spec: RMFormat, tokens: Mapping[str, str], kind: RMKind
) -> RMEncoder:
    """The encoder of a `kind` reward model of format `spec`: its tokenizer and its marker."""
    marker = spec.marker
    if marker is None:
        return RMEncoder(tokenizer)
    return RMEncoder(tokenizer, tokens[marker], f"reward_models.{kind}.tokens.{marker}")


def load_network(path: Path, spec: RMFormat, where: str, dtype: str = "float32") -> PreTrainedModel:
    """A pretrained checkpoint with its own head, checked against the format, in `dtype`."""
    config = _config(path, where)
    check_architecture(architecture(config), config.num_labels or 0, spec, where, str(path))
    with reading_checkpoint(path):
        net: PreTrainedModel = auto_class(config).from_pretrained(
            path, local_files_only=True, dtype=DTYPES[dtype]
        )
    check_network(net, spec, where)
    return net


def _config(path: Path, where: str) -> PretrainedConfig:
    if not (path / "config.json").is_file():
        raise MissingPathError(
            f"{where}.source {path} is not a model directory (no config.json): give a folder "
            "written by save_pretrained, 'policy', or for the PRM 'orm'"
        )
    with reading_checkpoint(path):
        config: PretrainedConfig = AutoConfig.from_pretrained(path, local_files_only=True)
    return config


def load_tokenizer(path: Path, where: str) -> Any:
    """The tokenizer saved in a model directory; an error naming `where` when it has none."""
    try:
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise MissingPathError(
            f"{where}.source {path} has no tokenizer that loads ({str(exc).splitlines()[0]}): a "
            "reward model reads the text in its own tokens, so save its tokenizer beside it"
        ) from exc
    return tokenizer


def check_source(
    settings: RewardModelSettings,
    kind: RMKind,
    policy_tokenizer: Any | None,
    max_length: int,
) -> None:
    """Pre-flight: raise a SettingError (or MissingPathError) naming the field when the
    `kind` RM's source cannot be read as its format, from its config and tokenizer (the
    weights are not loaded: the head is checked on a model built on the meta device).
    The policy's tokenizer (None: not available yet) checks a step-tag policy's tokens."""
    spec, where = settings.spec, f"reward_models.{kind}"
    if settings.source == ORM_SOURCE:
        return  # the ORM's own checks, and the config's rule that the formats agree
    if settings.source == POLICY_SOURCE:
        tokenizer = policy_tokenizer
        vocab_size = None
    else:
        path = Path(settings.source)
        config = _config(path, where)
        check_architecture(architecture(config), config.num_labels or 0, spec, where, str(path))
        if not spec.new_head:
            with torch.device("meta"):
                check_network(auto_class(config).from_config(config), spec, where)
        context = getattr(config, "max_position_embeddings", None)
        if context is not None and max_length > int(context):
            raise SettingError(
                f"reward_models.max_length = {max_length} exceeds the context of "
                f"{where}.source {path} (max_position_embeddings {context}): lower max_length"
            )
        tokenizer = load_tokenizer(path, where)
        vocab_size = getattr(config, "vocab_size", None)
        if vocab_size is not None and len(tokenizer) > vocab_size:
            raise SettingError(
                f"{where}.source {path}: its tokenizer has {len(tokenizer)} tokens, more than "
                f"the model's vocabulary of {vocab_size}, so it is not the model's own: save "
                "the tokenizer the model was trained with beside it"
            )
    if tokenizer is None:
        return
    try:
        ensure_pad_token(tokenizer)
    except SettingError as exc:
        raise SettingError(f"{where}.source {settings.source}: {exc}") from None
    read_token_ids(tokenizer, spec, settings.tokens, where, vocab_size)
    # A probe: a marker the tokenizer merges into the steps is found before any stage runs.
    marker_encoder(tokenizer, spec, settings.tokens, kind).encode("", "1+1=2\n#### 2")
