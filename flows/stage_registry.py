"""Stages by name, each with what it declares: its function, the tables it commits, the config
keys it reads, the checkpoints it writes and those it needs, and how its rows are reported.
The loop, the Prefect flow, forks, the rerun rule, tracking and the config's `run.stages` read
these declarations; the built-in stages register in flows/stage_table.py.

Torch-free, so a config loads (and a plan is refused) without importing torch: a stage's
function is named by its import path ("module:function") and imported on first use.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from flows.progress import ProgressFn
from flows.stage_results import StageResult
from grpo_core.contracts.registry import Registry

# stage(ctx, iteration, progress) -> StageResult. ctx is the run's RunContext (flows/context.py);
# it is not named here because it imports the config, which checks run.stages against this
# registry.
StageFn = Callable[[Any, int, ProgressFn], StageResult]
# A checkpoint relative to the stage's iteration k, (role, offset): (POLICY, 1) is
# policy_{k+1}, which the GRPO stage of iteration k writes (roles: flows/names.py).
Checkpoint = tuple[str, int]
Stage = tuple[str, int]  # (stage, iteration): one entry of a run's plan


@dataclass(frozen=True)
class Needs:
    """What a stage reads that an earlier stage of the plan writes: checkpoints and committed
    tables of its own iteration, with the setting that makes each needed where one does (it
    names the other fix when the plan lacks the writer)."""

    checkpoints: frozenset[Checkpoint] = frozenset()
    tables: frozenset[str] = frozenset()
    why: Mapping[Checkpoint | str, str] = field(default_factory=dict)


# (the run's ItergrpoConfig) -> what the stage needs under it; untyped for the reason of StageFn.
NeedsOf = Callable[[Any], Needs]


def needs_nothing(cfg: Any) -> Needs:
    """A stage that reads only the task, the config and what it computes itself."""
    return Needs()


def covers(declared: str, key: str) -> bool:
    """Whether a declared config key covers dotted `key`: a section ends with "." and covers
    every key under it, anything else only itself."""
    return key == declared or (declared.endswith(".") and key.startswith(declared))


@dataclass(frozen=True)
class StageSpec:
    """A registered stage and what it declares."""

    name: str  # as stored in the `stages` table, in Parquet file names and in run.stages
    impl: str | StageFn  # the function, or its "module:function" path
    summary: str  # one line: the config's description of run.stages, the Prefect task's
    commits: frozenset[str]  # the tables its commit may write (storage/schemas.py)
    # The config keys it reads (a section ends with "."), among those some stage declares:
    # a key no stage declares counts as read by every stage (the safe default of the rerun
    # rule). None: every key. `ignores` are keys inside `reads` it does not read (the most
    # specific of its declarations wins).
    reads: tuple[str, ...] | None = None
    ignores: tuple[str, ...] = ()
    # The first iteration at which it reads a key, where not 0 (a setting of later iterations).
    reads_from: Mapping[str, int] = field(default_factory=dict)
    writes: tuple[Checkpoint, ...] = ()  # checkpoints a fork copies with its commit
    needs: NeedsOf = needs_nothing
    once: bool = False  # runs once before the iterations (the warm start), else per iteration
    policy_offset: int = 0  # its per-iteration values describe policy_{k + offset}
    # Its metrics rows with a step are per step, tracked at the run's global step
    # (iteration x grpo.steps + step, as the GRPO stage's); else at policy_offset's policy.
    metrics_per_step: bool = False
    changes_iteration_table: bool = False  # adds or changes a row of the run's report table

    @cached_property
    def fn(self) -> StageFn:
        """The stage function (imported on first use when given by path)."""
        if not isinstance(self.impl, str):
            return self.impl
        module, _, name = self.impl.partition(":")
        fn: StageFn = getattr(importlib.import_module(module), name)
        return fn

    def declares(self, key: str) -> bool:
        """Whether one of its declarations covers config key `key` (dotted)."""
        return self.reads is None or any(covers(d, key) for d in (*self.reads, *self.ignores))

    def reads_key(self, key: str) -> bool:
        """Whether it reads config key `key` by its own declarations."""
        if self.reads is None:
            return True
        matches = [d for d in (*self.reads, *self.ignores) if covers(d, key)]
        return bool(matches) and max(matches, key=len) in self.reads


STAGES: Registry[StageSpec] = Registry("stage")


def register_stage(spec: StageSpec) -> StageSpec:
    """Register `spec` under its name (a name is registered once)."""
    return STAGES.add(spec.name, spec)


def _restore(entries: list[tuple[str, StageSpec]]) -> None:
    for name in STAGES.names():
        STAGES.remove(name)
    for name, spec in entries:
        STAGES.add(name, spec)


@contextlib.contextmanager
def registered(*specs: StageSpec) -> Iterator[None]:
    """`specs` registered for the `with` block (a test's toy stage; one of a registered name,
    e.g. a bench's timed wrapper, replaces it in place meanwhile), then the registry as it was."""
    saved = STAGES.items()
    new = {spec.name: spec for spec in specs}
    _restore([(name, new.pop(name, spec)) for name, spec in saved] + list(new.items()))
    try:
        yield
    finally:
        _restore(saved)


def iteration_stage_names() -> list[str]:
    """The stages run.stages may list: those that run per iteration, in registration order."""
    return [name for name, spec in STAGES.items() if not spec.once]


def check_iteration_stages(names: list[str]) -> list[str]:
    """`names` if each is a registered per-iteration stage listed once (a pydantic validator)."""
    for n, name in enumerate(names):
        if name not in STAGES:
            raise ValueError(f"unknown stage {name!r}: choose from {iteration_stage_names()}")
        if STAGES[name].once:
            raise ValueError(f"{name} runs once, before the iterations: leave it out of the list")
        if name in names[:n]:
            raise ValueError(f"{name} is listed twice: a stage runs once per iteration")
    return names


def iteration_stages_schema(schema: dict[str, Any]) -> None:
    """Pydantic `json_schema_extra` of run.stages: the per-iteration stages as the choices of
    each item, read when the schema is built (so later registrations show too)."""
    schema.setdefault("items", {})["enum"] = iteration_stage_names()


def stage_plan(iteration_stages: Sequence[str], iterations: int) -> list[Stage]:
    """Every (stage, iteration) of a run, in execution order: the stages that run once (the
    warm start), then `iteration_stages` in each iteration."""
    plan = [(name, 0) for name, spec in STAGES.items() if spec.once]
    for k in range(iterations):
        plan.extend((name, k) for name in iteration_stages)
    return plan


def _fix(writers: list[tuple[str, bool]], stage: str, listed: Sequence[str]) -> str:
    """How to fix a plan whose `stage` misses what `writers` write: (name, whether it must
    come before `stage` in an iteration, not in an earlier one)."""
    if not writers:
        return "no registered stage writes it"
    present = [name for name, _ in writers if name in listed]
    if present:
        return f"list {' or '.join(present)} before {stage} in run.stages"
    before = f", before {stage}" if all(same for _, same in writers) else ""
    return f"add {' or '.join(name for name, _ in writers)} to run.stages{before}"


def _checkpoint_writers(role: str, offset: int) -> list[tuple[str, bool]]:
    return [
        (name, (role, offset) in spec.writes)
        for name, spec in STAGES.items()
        if not spec.once and any(r == role for r, _ in spec.writes)
    ]


def _table_writers(table: str) -> list[tuple[str, bool]]:
    return [(n, True) for n, s in STAGES.items() if not s.once and table in s.commits]


def unmet_need(iteration_stages: Sequence[str], iterations: int, cfg: Any) -> str | None:
    """The first need (under config `cfg`) of the plan's stages that no stage before it
    writes, as a one-line error naming the fix; None when every stage finds what it reads."""
    checkpoints: set[tuple[str, int]] = set()
    tables: set[tuple[str, int]] = set()
    plan = stage_plan(iteration_stages, iterations)
    needs_of = {name: STAGES[name].needs(cfg) for name, _ in plan}
    for name, k in plan:
        spec, needs = STAGES[name], needs_of[name]
        for role, offset in sorted(needs.checkpoints):
            if (role, k + offset) not in checkpoints:
                why = needs.why.get((role, offset))
                writers = _checkpoint_writers(role, offset)
                return (
                    f"run.stages: {name} of iteration {k} reads {role}_{k + offset}"
                    f"{f' ({why})' if why else ''}, which no stage before it writes: "
                    f"{_fix(writers, name, iteration_stages)}"
                )
        for table in sorted(needs.tables):
            if (table, k) not in tables:
                why = needs.why.get(table)
                writers = _table_writers(table)
                return (
                    f"run.stages: {name} of iteration {k} reads the {table} rows of its "
                    f"iteration{f' ({why})' if why else ''}, which no stage before it commits: "
                    f"{_fix(writers, name, iteration_stages)}"
                )
        checkpoints |= {(role, k + offset) for role, offset in spec.writes}
        tables |= {(table, k) for table in spec.commits}
    return None
