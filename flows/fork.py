"""What one run may take over from another: the rerun rule (flows/config_readers.py) applied
across runs.

A stage of run B would compute what run A's committed stage computed when no config key on
which A and B differ is read by that stage or by any stage before it (a stage reads the
outputs of those before it). So B may start with A's committed stages, in execution order, up
to the first stage that reads a differing key; that is `shareable_prefix`. Keys that place the
work (cluster, store, tracking) and the run id do not count: they change where a result lives,
not what it is. The seed is read by every stage, so runs at different seeds share nothing.
`fork_from` copies that prefix into B through storage/fork.py. The data files the prefix read
must be what A read (flows/data_identity.py): B takes A's record of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from flows.config import ItergrpoConfig
from flows.config_files import PLACEMENT_SECTIONS, stored_config_as_current
from flows.config_readers import first_iteration_reading, stages_reading
from flows.data_identity import check_fork_data, data_now, record_data
from flows.plan import planned_stages
from flows.stage_table import STAGES, Stage
from storage.fork import fork_run
from storage.store import RunStore, config_diff

# Keys that never make two runs compute differently (placement, and the run's own name).
# Each ends with "." and is matched against key + ".": a section, or exactly one key.
NOT_RESULTS = (*(f"{section}." for section in PLACEMENT_SECTIONS), "run.run_id.")


def differing_keys(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[str]:
    """Dotted keys whose values differ between config trees `a` and `b` (placement and the
    run id left out)."""
    return [k for k in config_diff(a, b) if not (k + ".").startswith(NOT_RESULTS)]


def shareable_prefix(
    plan: list[Stage],
    committed: Iterable[Stage],
    source_config: Mapping[str, Any],
    target_config: Mapping[str, Any],
    readers: Callable[[str], frozenset[str] | None] = stages_reading,
    first_iteration: Callable[[str], int] = first_iteration_reading,
) -> list[Stage]:
    """The stages of `plan` (the target's, in execution order) the target may take from a
    source run that committed `committed`: those before the first stage that the source has
    not committed or that reads a key on which the two configs differ (a key `readers`
    returns None for is read by every stage; `first_iteration` says from which iteration on
    its readers read it)."""
    done = set(committed)
    blocking: dict[str, int] = {}  # stage -> the first iteration at which it reads a change
    for key in differing_keys(source_config, target_config):
        read_by = readers(key)
        if read_by is None:
            return []
        for stage in read_by:
            blocking[stage] = min(blocking.get(stage, first_iteration(key)), first_iteration(key))
    prefix = []
    for stage, iteration in plan:
        if (stage, iteration) not in done or iteration >= blocking.get(stage, iteration + 1):
            break
        prefix.append((stage, iteration))
    return prefix


def checkpoints_written(stages: Iterable[Stage]) -> list[tuple[str, int]]:
    """(role, iteration) of the checkpoints `stages` write, as their registrations declare
    (flows/stage_table.py): policy_0; RM_k; policy_{k+1} with its LoRA adapters and PPO
    critic. A stage's own resume points (GRPO progress, launcher jobs) are not needed once it
    is committed."""
    return [(role, k + offset) for stage, k in stages for role, offset in STAGES[stage].writes]


def prefix_from(store: RunStore, source: str, target: ItergrpoConfig) -> list[Stage]:
    """shareable_prefix of run `source` (its stored config and commits) for `target`;
    DataChangedError when the data that prefix read has changed since `source` read it."""
    stored = stored_config_as_current(store.run_config(source), target)
    committed = [(str(s["stage"]), int(s["iteration"])) for s in store.committed_stages(source)]
    prefix = shareable_prefix(
        planned_stages(target), committed, stored, target.model_dump(mode="json")
    )
    if prefix:
        read = {stage for stage, _ in prefix}
        check_fork_data(store, source, str(target.run.run_id), data_now(target), read)
    return prefix


def fork_from(store: RunStore, source: str, target: ItergrpoConfig, stages: list[Stage]) -> None:
    """Create run `target` holding `source`'s `stages` (a prefix from `prefix_from`), its data
    recorded as what `source` read (prefix_from checked it is)."""
    assert target.run.run_id is not None
    store.run_dir(target.run.run_id).mkdir(parents=True, exist_ok=True)
    record_data(store, target.run.run_id, data_now(target))
    fork_run(
        store,
        source,
        target.run.run_id,
        target.model_dump(mode="json"),
        stages=stages,
        checkpoints=checkpoints_written(stages),
        stage_readers=stages_reading,
    )


def describe(stages: list[Stage]) -> str:
    """`warm_start..evaluate of iteration 0` (the first and last stage shared)."""

    def one(stage: Stage) -> str:
        return stage[0] if STAGES[stage[0]].once else f"{stage[0]} of iteration {stage[1]}"

    first, last = one(stages[0]), one(stages[-1])
    return first if len(stages) == 1 else f"{first}..{last}"
