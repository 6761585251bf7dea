"""The binary logit each reward-model format reads at every token (reward_models/formats.py
names these functions): (B, L), the score being its sigmoid. A two-logit reading returns the
difference of the two, since softmax([a, b])[0] = sigmoid(a - b)."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor, nn
from transformers import PreTrainedModel


def _hidden_states(
    net: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None
) -> Tensor:
    """The backbone's last hidden states (B, L, H), without the model's own head."""
    out = net.base_model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        use_cache=False,
    )
    hidden: Tensor = out.last_hidden_state
    return hidden


def classifier_outputs(
    net: PreTrainedModel, input_ids: Tensor, attention_mask: Tensor, position_ids: Tensor | None
) -> Tensor:
    """A classifier's head at every token, (B, L, num_labels). A token classifier gives them
    itself; a sequence classifier's `score` head is applied to every hidden state (the model
    would pool the last non-pad one, and a PRM reads at step ends too)."""
    if type(net).__name__.endswith("ForTokenClassification"):
        logits: Tensor = net(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            use_cache=False,
        ).logits
        return logits
    head = net.score
    assert isinstance(head, nn.Module)
    scored: Tensor = head(_hidden_states(net, input_ids, attention_mask, position_ids))
    return scored


def scalar_logits(
    net: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    read_ids: Sequence[int],
) -> Tensor:
    """A one-logit head's logit."""
    return classifier_outputs(net, input_ids, attention_mask, position_ids)[..., 0]


def positive_class_logits(
    net: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    read_ids: Sequence[int],
) -> Tensor:
    """A two-class head's class-1 logit minus its class-0 logit."""
    pair = classifier_outputs(net, input_ids, attention_mask, position_ids)
    return pair[..., 1] - pair[..., 0]


def good_vs_bad_logits(
    net: PreTrainedModel,
    input_ids: Tensor,
    attention_mask: Tensor,
    position_ids: Tensor | None,
    read_ids: Sequence[int],
) -> Tensor:
    """A causal LM's next-token logit of the good token minus that of the bad token.

    Only the two rows of the output layer are applied: the full vocabulary's logits at every
    position would cost B x L x V floats for two numbers per position.
    """
    good, bad = read_ids
    output = net.get_output_embeddings()
    assert isinstance(output, nn.Linear)
    rows = [good, bad]
    bias = None if output.bias is None else output.bias[rows]
    pair = F.linear(
        _hidden_states(net, input_ids, attention_mask, position_ids), output.weight[rows], bias
    )
    return pair[..., 0] - pair[..., 1]
