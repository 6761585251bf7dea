"""Running an ablation: the shared policy_0 once, then every arm-seed run, then the `ablation`
table, each step skipped when the store already holds it (rerunning the command resumes).

The ablation is a run of its own (run id = ablation id, config = the suite): its warm_start
stage is the shared policy_0 and its `ablation` stage the table. Arm-seed runs are ordinary
runs started by an injected `run_arm` (a direct call, or the `iterative_rl` flow as a Prefect
subflow); they run one after another, since one run already keeps a 2-core machine busy.
An arm-seed run that has nothing committed first takes over what a complete one of the same
seed already computed with the same settings (`fork_done_work`, flows/fork.py: e.g. the
evaluation of policy_0 at that seed, or a whole iteration two arms share), unless the plan
says `fork=False` (`itergrpo ablate --no-fork`).
Each arm-seed start passes through the fault hook of flows/interrupts.py as a report of the
pseudo-stage `arm_run` whose iteration is the run's position (`SIGKILL@arm_run:3:1` kills the
process as the third arm-seed run starts).
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from flows.ablate.cost import stage_costs
from flows.ablate.results import Values
from flows.ablate.suites import AblationPlan, ArmRun
from flows.config import ItergrpoConfig
from flows.config_files import stored_config_as_current
from flows.config_readers import stages_reading
from flows.context import RunContext
from flows.data_identity import check_data, data_now, record_data
from flows.fork import describe, fork_from, prefix_from
from flows.interrupts import INTERRUPT, graceful_sigint, stopped_by_a_signal, with_fault_hook
from flows.loop import Executor, failure_record, planned_stages, tracked_run
from flows.names import EVAL_SPLIT, GRPO, WARM_START
from flows.progress import no_progress
from flows.runtime import apply_threads, name_deepspeed_accelerator
from flows.stages import STAGES
from flows.tracking.run_tracking import RunTracking, check_trackers
from storage.errors import ConfigMismatchError, StoreError
from storage.run_writer import RunWriter
from storage.store import RunStore

log = logging.getLogger("itergrpo")

ABLATION_TABLE = "ablation"  # the table, and the stage of the ablation's run that writes it
PROBLEMS_TABLE = "ablation_problems"  # written by the same stage: the per-problem values
ARM_RUN = "arm_run"  # the fault hook's name for "an arm-seed run starts"
RunArm = Callable[[ItergrpoConfig], None]
MakeExecutor = Callable[[RunContext], Executor]


def _minutes(seconds: float) -> str:
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def is_complete(store: RunStore, arm_run: ArmRun) -> bool:
    """Whether every planned stage of the arm-seed run is committed (it is then not rerun)."""
    if not store.run_dir(arm_run.run_id).is_dir():
        return False
    done = {(s["stage"], s["iteration"]) for s in store.committed_stages(arm_run.run_id)}
    return set(planned_stages(arm_run.config)) <= done


def ablation_rows(store: RunStore, plan: AblationPlan, runs: list[ArmRun]) -> list[dict[str, Any]]:
    """Rows of the `ablation` table: each arm-seed run's evaluations on the held-out split,
    and the cost of the GRPO stage behind each policy it trained (flows/ablate/cost.py)."""
    rows = []
    for r in runs:
        table = store.read("eval", run_id=r.run_id, where=f"split = '{EVAL_SPLIT}'")
        evals = table.to_pylist()
        costs = stage_costs(store.read("metrics", run_id=r.run_id, stage=GRPO).to_pylist())
        for policy, figures in sorted(costs.items()):
            evals += [
                {"policy_iteration": policy, "metric": name, "k": None, "value": value}
                for name, value in figures.items()
            ]
        for e in evals:
            rows.append(
                {
                    "ablation_id": plan.ablation_id,
                    "arm": r.arm,
                    "seed": r.seed,
                    "policy_iteration": e["policy_iteration"],
                    "metric": e["metric"],
                    "k": e["k"],
                    "value": e["value"],
                    "arm_run_id": r.run_id,
                }
            )
    return rows


def ablation_problem_rows(
    store: RunStore, plan: AblationPlan, runs: list[ArmRun]
) -> list[dict[str, Any]]:
    """Rows of `ablation_problems`: each arm-seed run's per-problem values on the held-out
    split (none from runs stored before `eval_problems` existed)."""
    rows = []
    for r in runs:
        found = store.read("eval_problems", run_id=r.run_id, where=f"split = '{EVAL_SPLIT}'")
        for e in found.to_pylist():
            rows.append(
                {"ablation_id": plan.ablation_id, "arm": r.arm, "seed": r.seed}
                | {key: e[key] for key in ("policy_iteration", "metric", "k", "value")}
                | {"problem_index": e["problem_index"], "problem_id": e["problem_id"]}
                | {"arm_run_id": r.run_id, "question": e["question"]}
            )
    return rows


def stored_values(store_root: Path, ablation_id: str) -> Values:
    """The committed ablation's values: its `ablation` rows and per-problem rows."""
    store = RunStore(store_root)
    return Values.from_rows(
        store.read(ABLATION_TABLE, run_id=ablation_id).to_pylist(),
        store.read(PROBLEMS_TABLE, run_id=ablation_id).to_pylist(),
    )


def _what_counts(record: dict[str, Any]) -> dict[str, Any]:
    """The parts of an ablation's record that make it the same ablation: its suite less the
    seed count (checked apart) and the suite's description and default seeds (they compute
    nothing), and policy_0's config less where it lives (store, cluster)."""
    suite = {k: v for k, v in record["ablation"].items() if k not in ("seeds", "spec")}
    spec = record["ablation"].get("spec", {})
    suite["spec"] = {k: v for k, v in spec.items() if k not in ("seeds", "description")}
    policy_0 = {k: v for k, v in record["policy_0"].items() if k not in ("store", "cluster")}
    return {"ablation": suite, "policy_0": policy_0}


def table_seeds(store: RunStore, ablation_id: str) -> int:
    """How many seeds the ablation's committed table holds (0 before it is committed)."""
    seeds = store.read(ABLATION_TABLE, run_id=ablation_id, columns=["seed"]).column("seed")
    return len(set(seeds.to_pylist()))


def check_record(store: RunStore, plan: AblationPlan) -> int:
    """Refuse to continue an ablation with another suite or base config, or with fewer seeds
    than its committed table holds (seeds may change before it is committed, since each
    arm-seed run stands alone, and may grow after: the new seeds run and the table is
    rewritten); open_run would only suggest `itergrpo run --force-config`. Returns the seeds
    of the committed table (0: none)."""
    if not (store.run_dir(plan.ablation_id) / "config.yaml").exists():
        return 0
    stored = store.run_config(plan.ablation_id)
    if "policy_0" in stored:  # as this version writes it, so renamed fields compare equal
        policy_0 = stored_config_as_current(stored["policy_0"], plan.policy_0_config())
        stored = {**stored, "policy_0": policy_0}
    if "ablation" not in stored:
        raise StoreError(
            f"run {plan.ablation_id!r} in {store.root} is not an ablation: pass another "
            "--ablation-id"
        )
    committed = {s["stage"] for s in store.committed_stages(plan.ablation_id)}
    if not committed:
        return 0  # nothing to stay consistent with: this suite replaces the stored one
    if _what_counts(stored) != _what_counts(plan.record()):
        raise StoreError(
            f"ablation {plan.ablation_id!r} was started with another suite or base config: "
            f"suite {stored['ablation']['suite']!r}. Pass a new --ablation-id, or rerun it with "
            "the suite it was started with"
        )
    finished = table_seeds(store, plan.ablation_id)
    if plan.seeds < finished:
        raise StoreError(
            f"ablation {plan.ablation_id!r} is finished with {finished} seeds, more than the "
            f"{plan.seeds} asked for: pass --seeds {finished} (or more, to add seeds to it), "
            "or a new --ablation-id"
        )
    return finished


def check_arm_runs(store: RunStore, runs: list[ArmRun]) -> None:
    """Before any work: each arm-seed run the store already has must still have its config
    (the suite changed since it started?) and no live process may hold its lock."""
    for r in runs:
        try:
            store.check_can_open(
                r.run_id,
                r.config.model_dump(mode="json"),
                upgrade_config=functools.partial(stored_config_as_current, current=r.config),
                stage_readers=stages_reading,
            )
        except ConfigMismatchError as exc:
            shown = ", ".join(exc.keys[:5])
            raise ConfigMismatchError(
                f"arm {r.arm!r}, seed {r.seed}: run {r.run_id} was started with another config "
                f"(differing keys: {shown}), so the suite changed since; pass a new "
                "--ablation-id, or restore the suite",
                exc.keys,
            ) from None


def child_of(parent_run_id: str | None, arm_run: ArmRun) -> ArmRun:
    """`arm_run` logged as a child of the ablation's MLflow run, tagged with its arm and seed
    (unchanged without MLflow)."""
    if parent_run_id is None:
        return arm_run
    cfg = arm_run.config
    tags = {**cfg.tracking.mlflow.tags, "mlflow.parentRunId": parent_run_id}
    tags |= {"arm": arm_run.arm, "seed": str(arm_run.seed)}
    mlflow = cfg.tracking.mlflow.model_copy(update={"tags": tags})
    tracking = cfg.tracking.model_copy(update={"mlflow": mlflow})
    return dataclasses.replace(arm_run, config=cfg.model_copy(update={"tracking": tracking}))


def _shared_policy_0(
    plan: AblationPlan, store: RunStore, record: RunWriter, make_executor: MakeExecutor
) -> None:
    if record.is_committed(0, WARM_START):
        log.info("ablation %s: shared policy_0 already committed", plan.ablation_id)
        return
    cfg = plan.policy_0_config()
    apply_threads(cfg.run.num_threads)
    name_deepspeed_accelerator(cfg.run.device)
    log.info("ablation %s: shared policy_0 (warm start, computed once)", plan.ablation_id)
    start = time.perf_counter()
    ctx = RunContext(cfg, store, record)
    try:
        make_executor(ctx)(WARM_START, 0, STAGES[WARM_START].fn)
    finally:
        ctx.close()
    log.info("ablation %s: policy_0 done in %.1f s", plan.ablation_id, time.perf_counter() - start)


def fork_done_work(store: RunStore, runs: list[ArmRun], arm_run: ArmRun) -> str | None:
    """Start `arm_run` (nothing of it committed) as a fork of the complete arm-seed run of
    `runs` with the longest shareable prefix (flows/fork.py); what was forked, or None."""
    if store.run_dir(arm_run.run_id).is_dir() and store.committed_stages(arm_run.run_id):
        return None  # a started run resumes as it is
    best: tuple[list[tuple[str, int]], ArmRun] | None = None
    for other in runs:
        if other.run_id == arm_run.run_id or not is_complete(store, other):
            continue
        prefix = prefix_from(store, other.run_id, arm_run.config)
        if prefix and (best is None or len(prefix) > len(best[0])):
            best = (prefix, other)
    if best is None:
        return None
    prefix, source = best
    try:
        fork_from(store, source.run_id, arm_run.config, prefix)
    except Exception as exc:  # undone by fork_run: the run computes everything itself
        return f"could not fork from {source.run_id} ({exc}); computing every stage"
    return f"forked {describe(prefix)} from {source.run_id}"


def time_left(remaining: list[ArmRun], took: dict[str, list[float]]) -> float:
    """Seconds the `remaining` runs should take: each at the mean wall of its arm's runs so
    far (arms differ: one that forks another's stages is faster), an arm not run yet at the
    mean of all runs so far."""
    every = [t for times in took.values() for t in times]
    if not every:
        return 0.0
    overall = sum(every) / len(every)
    means = {arm: sum(times) / len(times) for arm, times in took.items()}
    return sum(means.get(r.arm, overall) for r in remaining)


def _run_arms(
    store: RunStore, runs: list[ArmRun], run_arm: RunArm, began: float, *, fork: bool
) -> None:
    took: dict[str, list[float]] = {}
    # What is left to run: complete runs (a resumed or grown ablation's) are skipped.
    todo = {r.run_id: r for r in runs if not is_complete(store, r)}
    for position, arm_run in enumerate(runs, start=1):
        INTERRUPT.check()
        where = f"[{position}/{len(runs)}] arm {arm_run.arm}, seed {arm_run.seed}"
        if arm_run.run_id not in todo:
            log.info("%s: %s committed, skipped", where, arm_run.run_id)
            continue
        log.info(
            "%s: run %s (ablation %s elapsed)",
            where,
            arm_run.run_id,
            _minutes(time.perf_counter() - began),
        )
        with_fault_hook(no_progress, ARM_RUN, position)(0.0, f"{where} starts")
        start = time.perf_counter()
        if fork and (forked := fork_done_work(store, runs, arm_run)) is not None:
            log.info("%s: %s", where, forked)
        run_arm(arm_run.config)
        took.setdefault(arm_run.arm, []).append(time.perf_counter() - start)
        del todo[arm_run.run_id]
        log.info(
            "%s: done in %.0f s (ablation %s elapsed, about %s left)",
            where,
            took[arm_run.arm][-1],
            _minutes(time.perf_counter() - began),
            _minutes(time_left(list(todo.values()), took)),
        )


def run_ablation(
    plan: AblationPlan,
    *,
    make_executor: MakeExecutor,
    run_arm: RunArm,
    stop_signals: tuple[type[BaseException], ...] = (),
) -> list[dict[str, Any]]:
    """Run what the store lacks of `plan`; return the committed `ablation` rows. The record
    says `interrupted` after a stop (Ctrl-C, or one of the engine's `stop_signals`, as
    execute_run's), else `failed`."""
    began = time.perf_counter()
    store = RunStore(plan.store_root)
    runs = plan.arm_runs()
    finished = check_record(store, plan)
    if 0 < finished < plan.seeds:
        added = plan.seed_values()[finished:]
        which = f"seed {added[0]}" if len(added) == 1 else f"seeds {added[0]}-{added[-1]}"
        log.info(
            "ablation %s: its table holds %d seeds; adding %s, then rewriting it",
            plan.ablation_id,
            finished,
            which,
        )
    check_arm_runs(store, runs)
    policy_0 = plan.policy_0_config()
    check_trackers(policy_0.tracking)
    data = data_now(policy_0)  # what the shared policy_0 and so every arm run was computed on
    check_data(store, plan.ablation_id, data)
    # check_record has compared the stored record: it is replaced (the old one kept beside)
    with store.open_run(plan.ablation_id, plan.record(), force_config=True) as record:
        record_data(store, plan.ablation_id, data)
        record.set_status("running", failure=None)
        # The ablation's own tracking run (policy_0's evaluation) is the arm-seed runs' parent.
        tracking = RunTracking(policy_0.tracking, tracked_run(policy_0), store)
        tracked_runs = [child_of(tracking.mlflow_run_id, r) for r in runs]
        # The handler stays on while the final status is recorded (see flows/loop.py).
        with graceful_sigint():
            try:
                _shared_policy_0(plan, store, record, make_executor)
                tracking.sync()
                INTERRUPT.check()
                _run_arms(store, tracked_runs, run_arm, began, fork=plan.fork)
                if finished < plan.seeds:  # arm runs never touch the table: the count holds
                    # More seeds than a committed table: the new table supersedes it.
                    with record.stage(0, ABLATION_TABLE, supersede=True) as attempt:
                        attempt.write(ABLATION_TABLE, ablation_rows(store, plan, runs))
                        attempt.write(PROBLEMS_TABLE, ablation_problem_rows(store, plan, runs))
            except BaseException as exc:
                status = "interrupted" if stopped_by_a_signal(exc, stop_signals) else "failed"
                # The arm run that stopped keeps its own stage; the ablation's record says why.
                record.set_status(status, failure=failure_record(exc, None))
                tracking.finish_after_error(status)
                raise
        record.set_status("completed", iterations_done=0, arm_runs=len(runs))
        tracking.finish("completed")  # no run report: an ablation has its own (ablate/report.py)
    return store.read(ABLATION_TABLE, run_id=plan.ablation_id).to_pylist()
