"""Row de-duplication: equal rows get equal keys, merge into one slot with their count, and
the log-probs of every row come from one forward per distinct row. (That the update with
merged rows has the full batch's loss and gradient: test_update.py.)"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from grpo_core.algo.row_dedup import RowCopies, merge_rows, row_keys
from grpo_core.contracts.policy_batch import build_policy_batch
from grpo_core.model.forward import sequence_logprobs
from tests.models import tiny_llama

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_row_keys_tell_rows_apart_in_every_table() -> None:
    ids = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 4], [1, 2, 3]])
    values = torch.tensor([[0.5], [0.5], [0.5], [0.25]])
    keys = row_keys(ids, values)
    assert keys[0] == keys[1] and len(set(keys)) == 3  # row 2: ids differ; row 3: values
    assert all(len(k) == 16 for k in keys)  # a digest, whatever the row's length
    assert row_keys(ids)[3] == row_keys(ids)[0]


def test_row_keys_need_a_table() -> None:
    with pytest.raises(ValueError, match="at least one table"):
        row_keys()


def test_merge_rows_by_hand() -> None:
    keys = [b"a", b"b", b"a", b"c", b"b", b"a"]
    mini = torch.tensor([5, 1, 3, 0, 4])  # a shuffled mini-batch: a, b, c, a, b
    merged = merge_rows(keys, mini)
    assert merged.distinct.tolist() == [5, 1, 3]  # the first of each key, in mini-batch order
    assert merged.counts.tolist() == [2, 2, 1]
    assert merged.slot.tolist() == [0, 1, 2, 0, 1]
    rows, at = merged.copies_of(torch.tensor([1, 2]))  # slots of b and c
    assert rows.tolist() == [1, 3, 4] and at.tolist() == [0, 1, 0]


def test_copies_keys_join_the_tokens_with_other_tables() -> None:
    batch = build_policy_batch([[1, 2], [1, 2], [1, 2]], [[3, 4], [3, 4], [3, 5]], pad_id=0)
    copies = RowCopies(batch)
    assert copies.firsts.tolist() == [0, 2] and copies.group.tolist() == [0, 0, 1]
    advantages = torch.tensor([[1.0], [2.0], [1.0]])
    keys = copies.keys(advantages, None)  # None: a table the caller does not have
    assert len(set(keys)) == 3  # rows 0 and 1: same tokens, other advantages
    assert copies.keys(torch.ones(3, 1))[0] == copies.keys(torch.ones(3, 1))[1]


def test_logprobs_run_one_forward_per_distinct_row() -> None:
    prompts = [[1, 2], [3], [1, 2], [1, 2]]
    completions = [[4, 5, 6], [7], [4, 5, 6], [4, 5]]
    batch = build_policy_batch(prompts, completions, pad_id=0, padding_side="left")
    model = tiny_llama()
    rows: list[int] = []

    def record(_: torch.nn.Module, args: Any, kwargs: dict[str, Any]) -> None:
        if "logits_to_keep" not in kwargs:  # a shared prompt's pass is not a row's forward
            rows.append(int(kwargs["input_ids"].shape[0]))

    model.register_forward_pre_hook(record, with_kwargs=True)
    got = RowCopies(batch).logprobs(model, temperature=1.0, micro_batch_size=8)
    assert sum(rows) == 3  # rows 0 and 2 are one forward
    with torch.no_grad():
        every = sequence_logprobs(model, batch, 1.0, 8)
    torch.testing.assert_close(got, every)
