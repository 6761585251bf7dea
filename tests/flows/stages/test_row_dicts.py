"""Stage rows for the store: row_dicts gives what dataclasses.asdict gives, field order too."""

from __future__ import annotations

import dataclasses

from flows.stage_results import row_dicts
from reward_models.labelling import OrmLabel, PrmLabel
from reward_models.training import TrainedRow


def test_row_dicts_equal_asdict_in_field_order() -> None:
    rows = [
        TrainedRow("prm", "p1", 3, 2, 0.5, "replay", 1, 0, "prm_labels"),
        TrainedRow("orm", "p2", 4, None, 1.0, "new", 2, 1, "orm_labels"),
    ]
    labels = [OrmLabel("p1", 0, 1), PrmLabel("p1", 0, 1, "1+1=2\n", 5, 4, 3, 1, 0.75, 1)]
    for group in (rows, labels):
        got = row_dicts(group)
        want = [dataclasses.asdict(r) for r in group]
        assert got == want
        assert [list(d) for d in got] == [list(d) for d in want]
    assert row_dicts([]) == []
