"""The suite's split over xdist workers (tests/xdist_scheduling.py): Ray tests in one unit,
Prefect-server tests in one unit, modules whole, long units first."""

from __future__ import annotations

import re
from pathlib import Path

from tests.xdist_scheduling import (
    PREFECT,
    RAY,
    RAY_MODULES,
    ROOT,
    UNIT_SECONDS,
    unit_of,
    unit_weight,
)

STARTS_RAY = re.compile(r"ray\.init\(|train_workers=ray|\"train_workers\": \"ray\"")


def test_every_module_that_starts_ray_is_in_the_ray_unit() -> None:
    """A new module starting a local Ray cluster must join RAY_MODULES, or two clusters may
    start at once on one machine."""
    starting = {
        str(p.relative_to(ROOT))
        for p in (ROOT / "tests").rglob("test_*.py")
        if p != Path(__file__).resolve() and STARTS_RAY.search(p.read_text(encoding="utf-8"))
    }
    # These only name the setting in refusals (no Ray runs).
    refusals_only = {
        "tests/flows/test_lora_config.py",
        "tests/flows/engines/test_engines_flow.py",
        "tests/flows/test_async_config.py",
    }
    assert starting - refusals_only <= RAY_MODULES
    assert all((ROOT / m).is_file() for m in RAY_MODULES)


def test_units() -> None:
    ray_test = "tests/flows/engines/test_ray_shards.py::test_x"
    assert unit_of(ray_test) == RAY
    assert unit_of("tests/flows/prefect/test_flow.py::test_y[a]") == PREFECT
    assert unit_of("tests/storage/test_replay.py::test_z") == "tests/storage/test_replay.py"


def test_long_units_sort_first() -> None:
    demo_scale = "tests/reward_models/test_demo_rm.py"  # measured: one long test
    slow_module = "tests/flows/test_precision.py"  # a slow mark, not measured (short)
    fast_module = "tests/storage/test_replay.py"  # no slow mark, many tests
    order = sorted(
        [(fast_module, 40), (slow_module, 1), (demo_scale, 1), (RAY, 20), (PREFECT, 10)],
        key=lambda u: unit_weight(*u),
    )
    assert [unit for unit, _ in order] == [RAY, PREFECT, demo_scale, slow_module, fast_module]


def test_every_measured_unit_is_a_unit() -> None:
    """A measured module that moved into the Ray or Prefect unit, or went away, would weigh
    nothing: its time belongs to the unit now."""
    for unit in UNIT_SECONDS.keys() - {RAY, PREFECT}:
        assert (ROOT / unit).is_file(), unit
        assert unit_of(f"{unit}::test_x") == unit, unit
