"""What a reward model reads: the output's text in the RM's own tokens, and which of those
tokens hold each step's score and the outcome score.

The steps are found on the text (grpo_core/data/reasoning_steps.py), so they are the policy's
steps whatever either tokenizer does; a character position is mapped to the RM token that
holds it through the RM tokenizer's offset mapping. Formats with a marker (a step tag or
separator) read the text with the marker written after each step's last character.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_core.contracts.errors import SettingError
from grpo_core.data.reasoning_steps import step_spans
from grpo_core.model.policy import encode_prompt


@dataclass(frozen=True)
class CompletionView:
    """The completion as the RM reads it, and the character each score is read at.

    step_chars: per step, its last character (no marker) or the marker's last character.
    outcome_char: the character the outcome score is read at; None: the last token (and for
    an empty completion the prompt's last token). markers: [start, end) of each marker.
    """

    text: str
    step_chars: list[int]
    outcome_char: int | None
    markers: list[tuple[int, int]]


def completion_view(completion: str, marker: str | None) -> CompletionView:
    """The completion with `marker` written after each step (none: the text as it is).

    With a marker the outcome is read at the last step's marker; a completion without steps
    gets one marker at its end, so it has an outcome score too.
    """
    spans = step_spans(completion)
    if marker is None:
        return CompletionView(completion, [end - 1 for _, end in spans], None, [])
    if not marker:
        raise ValueError("a marker must be a non-empty string")
    pieces: list[str] = []
    markers: list[tuple[int, int]] = []
    length, copied = 0, 0
    for _, end in spans or [(0, len(completion))]:
        pieces.append(completion[copied:end])
        length += end - copied
        markers.append((length, length + len(marker)))
        pieces.append(marker)
        length += len(marker)
        copied = end
    pieces.append(completion[copied:])
    step_chars = [stop - 1 for _, stop in markers] if spans else []
    return CompletionView("".join(pieces), step_chars, markers[-1][1] - 1, markers)


def tokens_holding(offsets: list[tuple[int, int]], chars: list[int]) -> list[int]:
    """For each character index (ascending), the index of the token whose span holds it."""
    out: list[int] = []
    token = 0
    for char in chars:
        while token < len(offsets) and offsets[token][1] <= char:
            token += 1
        if token == len(offsets) or offsets[token][0] > char:
            raise ValueError(f"no token holds character {char} (token offsets {offsets})")
        out.append(token)
    return out


@dataclass(frozen=True)
class RMInput:
    """One output in the RM's tokens: step_positions and outcome_position index
    completion_ids (-1: the prompt's last token, for an empty completion)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    step_positions: list[int]
    outcome_position: int


@dataclass(frozen=True)
class RMEncoder:
    """Tokenizes outputs for one reward model: its own tokenizer and its marker (if any).

    field: the config field of the marker, named when the tokenizer merges it into the text.
    """

    tokenizer: Any  # a transformers fast tokenizer (offsets)
    marker: str | None = None
    field: str = "tokens"

    def encode(self, prompt_text: str, completion: str) -> RMInput:
        """The prompt as the rollout engine encodes it (in this tokenizer), then the
        completion view without special tokens, with the tokens to read."""
        if not getattr(self.tokenizer, "is_fast", False):
            raise SettingError(
                "a reward model's tokenizer must be a fast one (tokenizer.json): its character "
                "offsets place the steps; save the tokenizer with transformers' fast class"
            )
        view = completion_view(completion, self.marker)
        enc = self.tokenizer(view.text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), [tuple(o) for o in enc["offset_mapping"]]
        steps = tokens_holding(offsets, view.step_chars)
        if view.outcome_char is None:
            outcome = len(ids) - 1
        else:
            (outcome,) = tokens_holding(offsets, [view.outcome_char])
        marker_ends = tokens_holding(offsets, [end - 1 for _, end in view.markers])
        for (start, end), token in zip(view.markers, marker_ends, strict=True):
            if offsets[token][0] < start or offsets[token][1] != end:
                held = view.text[offsets[token][0] : offsets[token][1]]
                raise SettingError(
                    f"{self.field} = {self.marker!r} is merged with the text around it by the "
                    f"reward model's tokenizer (its last token is {held!r}): choose a marker "
                    "the tokenizer keeps apart, e.g. one of its special tokens"
                )
        return RMInput(encode_prompt(self.tokenizer, prompt_text), ids, steps, outcome)
