"""What a reward model reads: the completion with its format's marker after each step, and
the RM token each step's score is read at, mapped from the text by character offsets."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import PreTrainedTokenizerFast

from grpo_core.contracts.errors import SettingError
from grpo_core.data.reasoning_steps import step_end_token_indices, step_spans
from grpo_core.model.policy import build_char_tokenizer
from reward_models.views import CompletionView, RMEncoder, completion_view, tokens_holding
from tests.rm_checkpoints import rm_tokenizer

CHAR = build_char_tokenizer()


def test_a_marker_follows_each_steps_last_character_and_is_read_there() -> None:
    view = completion_view("1+1=2 \n\n  #### 2\n", "<s>")
    assert view.text == "1+1=2<s> \n\n  #### 2<s>\n"
    assert view.markers == [(5, 8), (19, 22)]
    assert view.step_chars == [7, 21] and view.outcome_char == 21


def test_without_a_marker_steps_are_read_at_their_last_character() -> None:
    view = completion_view("1+1=2 \n\n  #### 2\n", None)
    assert (view.text, view.step_chars, view.outcome_char) == (
        "1+1=2 \n\n  #### 2\n",
        [4, 15],
        None,
    )


def test_an_output_without_steps_gets_one_marker_for_its_outcome() -> None:
    assert completion_view("", "|") == CompletionView("|", [], 0, [(0, 1)])
    assert completion_view(" \n", "|") == CompletionView(" \n|", [], 2, [(2, 3)])


def test_tokens_holding_finds_the_token_whose_span_holds_each_character() -> None:
    offsets = [(0, 3), (3, 4), (5, 7)]  # the space at 4 belongs to no token
    assert tokens_holding(offsets, [0, 2, 3, 6]) == [0, 0, 1, 2]
    with pytest.raises(ValueError, match="no token holds character 4"):
        tokens_holding(offsets, [4])


def test_an_empty_completion_is_read_at_the_last_prompt_token() -> None:
    read = RMEncoder(CHAR).encode("Q: 1+1\nA:\n", "")
    assert (read.completion_ids, read.step_positions, read.outcome_position) == ([], [], -1)
    assert read.prompt_ids == CHAR("Q: 1+1\nA:\n")["input_ids"]


def test_a_slow_tokenizer_is_refused_for_lack_of_offsets() -> None:
    class Slow:
        is_fast = False

    with pytest.raises(SettingError, match="must be a fast one"):
        RMEncoder(Slow()).encode("Q", "1")


LINES = st.lists(
    st.tuples(
        st.text(" ", max_size=2),
        st.text("0123456789+-=#", max_size=8),
        st.text(" ", max_size=2),
    ),
    min_size=0,
    max_size=5,
)


def _completion(lines: list[tuple[str, str, str]]) -> str:
    return "\n".join(a + b + c for a, b, c in lines)


TOKENIZERS = {"char": CHAR, "rm-bpe": rm_tokenizer()}


@pytest.mark.parametrize("name", list(TOKENIZERS))
@settings(max_examples=60, deadline=None)
@given(lines=LINES)
def test_offsets_put_each_step_on_the_token_the_decoded_prefix_places_it(
    name: str, lines: list[tuple[str, str, str]]
) -> None:
    """An independent route: the step-end search by decoding prefixes (the policy's)."""
    tok: PreTrainedTokenizerFast = TOKENIZERS[name]  # type: ignore[assignment]
    completion = _completion(lines)
    read = RMEncoder(tok).encode("Q: 1\nA:\n", completion)
    assert read.step_positions == step_end_token_indices(read.completion_ids, tok)
    assert len(read.step_positions) == len(step_spans(completion))
    assert read.outcome_position == len(read.completion_ids) - 1


@pytest.mark.parametrize(
    ("name", "marker"), [("char", "|"), ("rm-bpe", " ки"), ("rm-bpe", "<extra_0>")]
)
@settings(max_examples=60, deadline=None)
@given(lines=LINES)
def test_each_step_is_read_at_the_token_ending_its_marker(
    name: str, marker: str, lines: list[tuple[str, str, str]]
) -> None:
    tok: PreTrainedTokenizerFast = TOKENIZERS[name]  # type: ignore[assignment]
    completion = _completion(lines)
    read = RMEncoder(tok, marker).encode("Q: 1\nA:\n", completion)
    view = completion_view(completion, marker)
    steps = step_spans(completion)
    assert len(read.step_positions) == len(steps)
    ids = read.completion_ids
    for (start, end), pos in zip(view.markers[: len(steps)], read.step_positions, strict=True):
        # Decoded, the tokens through the one read end exactly with this step's marker, and
        # those before it reach into the marker: the read token holds nothing but marker.
        assert tok.decode(ids[: pos + 1]) == view.text[:end]
        assert len(tok.decode(ids[:pos])) >= start
    last = view.markers[-1][1]
    assert tok.decode(ids[: read.outcome_position + 1]) == view.text[:last]
