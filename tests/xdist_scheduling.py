"""How `make test` splits the suite over pytest-xdist workers: whole modules, longest first.

A module is one unit of work, so its module-scoped fixtures (an MLflow server, trained
models) start once. Two kinds of test share a unit across modules: the tests that start a
local Ray cluster (two clusters on one machine contend for ports and a session directory)
and the tests on the session's Prefect server (started once in the worker that runs them).
Units go out longest first (measured seconds, UNIT_SECONDS; then the modules with `slow`
tests, then by test count), so the run ends on short modules instead of one worker finishing
a long unit alone while the other waits. (xdist's own `loadgroup` cannot be used: with
pytest 9.2 the group suffix it writes into node ids is ignored.)
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
# Seconds each long unit takes (its tests' junit times summed, set-up included), measured
# under `make test`'s two workers on a loaded 2-core machine (2026-11-28, after issue 55's
# tests; the Ray unit suffers most from load: ~2x its quiet time; the DPO, distillation,
# pairwise-ORM and asynchronous-GRPO modules added later from single-process times, scaled).
# Longest first is what packs two workers well; by slow marks alone, the demo-scale test (one
# mark, one test) went out after every module with more tests. Units under ~15 s are left
# out: they follow, by slow marks and test count. Re-measure with `--junitxml` when a unit's
# time changes much.
UNIT_SECONDS: dict[str, int] = {
    RAY: 695,
    "tests/flows/engines/test_engines_flow.py": 165,
    PREFECT: 165,
    "tests/reward_models/test_demo_rm.py": 110,
    "tests/grpo_core/model/test_warm_start.py": 110,
    "tests/flows/test_ppo_e2e.py": 80,
    "tests/flows/test_kill_resume.py": 70,
    "tests/flows/prefect/test_interrupt.py": 65,
    "tests/flows/tracking/test_tracking_e2e.py": 65,
    "tests/flows/test_lora_e2e.py": 65,
    "tests/flows/test_pretrained_rms_e2e.py": 50,
    "tests/reward_models/test_learning.py": 50,
    "tests/flows/ablate/test_e2e.py": 45,
    "tests/grpo_core/engines/test_deepspeed_engine.py": 40,
    "tests/flows/test_guards_e2e.py": 40,
    "tests/flows/test_small_data_e2e.py": 35,
    "tests/flows/test_continue_run.py": 35,
    "tests/flows/ablate/test_fork_e2e.py": 30,
    "tests/flows/test_dpo_e2e.py": 35,
    "tests/flows/test_dapo_e2e.py": 30,
    "tests/flows/test_distill_e2e.py": 30,
    "tests/flows/test_pairwise_orm_e2e.py": 25,
    "tests/flows/test_async_e2e.py": 40,
    "tests/grpo_core/model/test_smollm2.py": 25,
    "tests/flows/test_code_task_e2e.py": 70,
    "tests/flows/test_curriculum_e2e.py": 25,
    "tests/grpo_core/data/test_python_sandbox.py": 20,
    "tests/grpo_core/data/test_code_task.py": 20,
    "tests/flows/test_local_data_e2e.py": 20,
    "tests/flows/test_quiet_console.py": 15,
    "tests/flows/test_prompt_styles_e2e.py": 15,
}
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


def unit_weight(unit: str, tests: int) -> tuple[int, int, int]:
    """Sort key, longest first: the unit's measured seconds, then the `slow` marks in its
    modules, then its tests."""
    modules = RAY_MODULES if unit == RAY else {unit}
    slow = sum(len(_SLOW.findall(_module_text(m))) for m in modules)
    return (-UNIT_SECONDS.get(unit, 0), -slow, -tests)


class ModuleUnitScheduling(LoadScopeScheduling):
    """LoadScopeScheduling with `unit_of` as the scope and the longest units handed out first."""

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
