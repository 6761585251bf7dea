"""first_copies: equal keys grouped in order of first appearance."""

from grpo_core.contracts.copies import first_copies


def test_first_copies_by_hand() -> None:
    firsts, groups = first_copies(["b", "a", "b", "c", "a", "b"])
    assert firsts == [0, 1, 3]  # b, a, c where each first appears
    assert groups == [0, 1, 0, 2, 1, 0]
    assert first_copies([]) == ([], [])
