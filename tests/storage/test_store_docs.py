"""The notebook example of docs/store-and-sql.md runs as written on a completed `micro` run,
and gives what its comments say."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest

from storage.layout import STORE_ENV
from storage.store import RunStore
from tests.flow_helpers import REPO

pytestmark = pytest.mark.slow
PAGE = REPO / "docs" / "store-and-sql.md"


def python_example(page: Path, heading: str) -> str:
    """The ```python block under `heading` of `page`."""
    section = page.read_text().split(f"\n## {heading}\n", 1)[1].split("\n## ", 1)[0]
    (block,) = re.findall(r"```python\n(.*?)```", section, re.S)
    return str(block)


def test_the_notebook_example_runs_on_a_micro_run(
    micro_run: tuple[RunStore, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, run_id = micro_run
    monkeypatch.setenv(STORE_ENV, str(store.root))
    names: dict[str, Any] = {}
    exec(compile(python_example(PAGE, "From Python (a notebook)"), str(PAGE), "exec"), names)
    iterations = names["config"]["run"]["iterations"]
    steps = names["config"]["grpo"]["steps"]
    assert names["run"] == run_id
    assert isinstance(names["runs"], pd.DataFrame)
    assert names["runs"].set_index("run_id").loc[run_id, "status"] == "completed"
    assert names["acc"]["iteration"].tolist() == list(range(iterations))
    assert names["acc"]["acc"].between(0, 1).all()
    assert len(names["per_step"]) == iterations * steps
    assert isinstance(names["evals"], pa.Table) and names["evals"].num_rows > 0
