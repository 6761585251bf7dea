from typing import ClassVar

from grpo_core.data.reasoning_steps import split_steps, step_end_token_indices
from grpo_core.model.policy import build_char_tokenizer


def test_split_steps_drops_empty_lines_and_keeps_final_line() -> None:
    assert split_steps("3+4=7\n\n  7-2=5 \n#### 5\n") == ["3+4=7", "7-2=5", "#### 5"]
    assert split_steps("") == []


def test_step_ends_with_char_tokenizer() -> None:
    tok = build_char_tokenizer()
    text = "3+4=7\n7-2=5\n#### 5"
    ids = [*tok(text, add_special_tokens=False)["input_ids"], tok.eos_token_id]
    ends = step_end_token_indices(ids, tok)
    assert ends == [4, 10, 17]
    assert [str(tok.decode(ids[: e + 1])).split("\n")[-1] for e in ends] == split_steps(text)


class MergingTokenizer:
    """BPE-like toy: a token may hold the end of a line, the newline and the next line's start."""

    pieces: ClassVar[dict[int, str]] = {
        0: "3+4",
        1: "=7\n7",
        2: "-2=5",
        3: "\n\n#",
        4: "### 5",
        5: "<eos>",
    }

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True, **kw: object) -> str:
        return "".join(self.pieces[i] for i in token_ids if not (skip_special_tokens and i == 5))


def test_step_ends_with_merged_newlines() -> None:
    assert step_end_token_indices([0, 1, 2, 3, 4, 5], MergingTokenizer()) == [1, 2, 4]
