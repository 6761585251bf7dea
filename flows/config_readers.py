"""Which stages read which config keys: the rule for rerunning a run with a corrected field.

A run that failed in a stage may be rerun with a field changed, without --force-config, when
no committed stage read that field: the stages that did commit would have computed the same
with the new value, so the run still equals a clean run with the new config. Each stage
declares the keys it reads in its registration (flows/stage_table.py); a key no stage
declares counts as read by every stage (the safe default: such a field refuses the rerun once
anything is committed).
"""

from __future__ import annotations

from flows.stage_table import STAGES, covers

# Read by no stage's outputs: a guard only decides whether a stage may commit.
READ_BY_NO_STAGE = ("guards.",)
# The plan: every stage of an iteration reads what the stages before it in the plan wrote.
# The warm start runs first whatever it says.
PLAN_KEY = "run.stages"


def stages_reading(key: str) -> frozenset[str] | None:
    """The stages that read config key `key` (dotted), None for every stage."""
    if any(covers(declared, key) for declared in READ_BY_NO_STAGE):
        return frozenset()
    specs = STAGES.items()
    if key == PLAN_KEY:
        return frozenset(name for name, spec in specs if not spec.once)
    if not any(spec.declares(key) for _, spec in specs):
        return None
    return frozenset(name for name, spec in specs if spec.reads_key(key))


def first_iteration_reading(key: str) -> int:
    """The first iteration whose stages (of `stages_reading(key)`) read `key`: 0 for most."""
    readers = [spec for _, spec in STAGES.items() if spec.reads_key(key)]
    return min((spec.reads_from.get(key, 0) for spec in readers), default=0)
