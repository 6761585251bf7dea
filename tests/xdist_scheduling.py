"""How `make test` splits the suite over pytest-xdist workers: whole modules, heaviest first.

A module is one unit of work, so its module-scoped fixtures (an MLflow server, trained
models) start once. Two kinds of test share a unit across modules: the tests that start a
local Ray cluster (two clusters on one machine contend for ports and a session directory)
and the tests on the session's Prefect server (started once in the worker that runs them).
Units go out heaviest first — the modules with `slow` tests, then by test count — so the run
ends on short modules instead of one worker finishing a demo-scale test alone while the
other waits. (xdist's own `loadgroup` cannot be used: with pytest 9.2 the group suffix it
writes into node ids is ignored.)
"""

from __future__ import annotations

import re
from collections import OrderedDict
from functools import cache
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadScopeScheduling

ROOT = Path(__file__).resolve().parent.parent
RAY_MODULES = frozenset(
    {
        "tests/flows/engines/test_ray_shards.py",
        "tests/flows/engines/test_train_workers.py",
        "tests/flows/engines/test_train_workers_e2e.py",
        "tests/flows/engines/test_train_workers_gpu.py",
        "tests/flows/engines/test_vllm_actors.py",
        "tests/flows/engines/test_train_workers_nodes.py",
    }
)
RAY, PREFECT = "ray", "prefect"
_SLOW = re.compile(r"mark\.slow\b")


@cache
def _module_text(module: str) -> str:
    path = ROOT / module
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def unit_of(nodeid: str) -> str:
    """The unit of work a test belongs to: `ray`, `prefect` or its module's path."""
    module = nodeid.split("::", 1)[0]
    if module in RAY_MODULES:
        return RAY
    if "prefect_harness" in _module_text(module):
        return PREFECT
    return module


def unit_weight(unit: str, tests: int) -> tuple[int, int]:
    """Sort key, heaviest first: the `slow` marks in the unit's modules, then its tests."""
    modules = RAY_MODULES if unit == RAY else {unit}
    if unit == PREFECT:  # every module on the Prefect server counts
        return (-1000, -tests)
    slow = sum(len(_SLOW.findall(_module_text(m))) for m in modules)
    return (-slow, -tests)


class ModuleUnitScheduling(LoadScopeScheduling):
    """LoadScopeScheduling with `unit_of` as the scope and heaviest units handed out first."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self._ordered = False

    def _split_scope(self, nodeid: str) -> str:
        return unit_of(nodeid)

    def _assign_work_unit(self, node: Any) -> None:
        if not self._ordered:  # the queue is complete at the first assignment
            units = sorted(self.workqueue.items(), key=lambda u: unit_weight(u[0], len(u[1])))
            self.workqueue = OrderedDict(units)
            self._ordered = True
        super()._assign_work_unit(node)
