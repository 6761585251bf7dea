"""`itergrpo ablate`: run a suite's arms x seeds (or resume it), then print the results table
and the paper's orderings with their verdicts, and write the report."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import shlex
import sys
import time
from typing import Any

from flows.ablate.suites import AblationPlan, load_suite, make_plan, suite_from_tree, suite_names
from flows.cli.options import nonempty, store_option
from flows.config import ItergrpoConfig
from flows.config_files import load_config
from flows.interrupts import RunInterrupted
from storage.store import RunStore, resolve_store_root

log = logging.getLogger("itergrpo")


def _run_directly(cfg: ItergrpoConfig) -> None:
    from flows.loop import execute_run
    from flows.preflight import preflight

    preflight(cfg)  # a refused arm run is one clean line, before it writes anything
    execute_run(cfg)


def _execute(plan: AblationPlan, *, use_prefect: bool) -> bool:
    """Run `plan`; whether it wrote the ablation's report (the Prefect flow does, for its
    artifact)."""
    from transformers.utils import logging as hf_logging

    from flows.preflight_data import check_policy_and_data

    hf_logging.disable_progress_bar()
    check_policy_and_data(plan.policy_0_config())  # the task and policy every arm shares
    if not use_prefect:
        from flows.ablate.run import run_ablation
        from flows.loop import call_directly

        run_ablation(plan, make_executor=call_directly, run_arm=_run_directly)
        return False
    from flows.ablate.flow import ablate
    from flows.prefect_flow import raise_for_flow_state
    from flows.prefect_server import prefect_api

    with prefect_api():
        state = ablate(
            plan.ablation_id,
            plan.suite_name,
            plan.suite.model_dump(mode="json"),
            plan.seeds,
            str(plan.store_root),
            fork=plan.fork,
            return_state=True,
        )
    raise_for_flow_state(state, "interrupted")
    return True


def run_plan(plan: AblationPlan, *, use_prefect: bool) -> int:
    """Run (or resume) `plan`; print the table, the verdicts and where the report is."""
    from flows.ablate.cost import COST_NOTE, format_cost_table
    from flows.ablate.report import verdict_lines, write_ablation_report
    from flows.ablate.results import CLAIMS_NOTE, format_results_table
    from flows.ablate.run import stored_values

    runs = plan.arm_runs()
    arms = ", ".join(plan.suite.arms)
    print(
        f"itergrpo ablate: suite {plan.suite_name!r} ({len(plan.suite.arms)} arms: {arms}) x "
        f"{plan.seeds} seeds = {len(runs)} runs from one shared policy_0, one after another"
    )
    start = time.perf_counter()
    try:
        report_written = _execute(plan, use_prefect=use_prefect)
    except (RunInterrupted, KeyboardInterrupt) as exc:  # a Ctrl-C outside the run's handler too
        store = shlex.quote(str(plan.store_root))
        reason = str(exc) or "interrupted by SIGINT"
        print(
            f"{reason}: rerun the same command, or itergrpo resume {plan.ablation_id} "
            f"--store {store}",
            file=sys.stderr,
        )
        return 130
    values = stored_values(plan.store_root, plan.ablation_id)
    out_dir = plan.store_root / "reports" / plan.ablation_id
    if not report_written:
        write_ablation_report(values, plan.ablation_id, plan.suite.description, out_dir)
    print()
    print(format_results_table(values))
    if cost := format_cost_table(values):
        print(f"\ncost per arm\n{cost}\n{COST_NOTE}")
    print()
    print(verdict_lines(values))
    print()
    print(CLAIMS_NOTE)
    print(f"\nablation {plan.ablation_id} finished in {time.perf_counter() - start:.0f} s")
    print(f"report: {out_dir}")
    query = "SELECT arm, count(DISTINCT seed) AS seeds FROM ablation GROUP BY 1"
    print(f'query:  itergrpo sql "{query}" --store {shlex.quote(str(plan.store_root))}')
    return 0


def cmd_ablate(args: argparse.Namespace) -> int:
    name, suite = load_suite(args.suite)
    # The store as for a run of the suite's base config: --store, $ITERGRPO_STORE, its store.root.
    configured = load_config(suite.config, suite.overrides).store.root or None
    plan = make_plan(
        name,
        suite,
        seeds=args.seeds,
        ablation_id=args.ablation_id,
        store_root=resolve_store_root(args.store, configured),
    )
    plan = dataclasses.replace(plan, fork=not args.no_fork)
    return run_plan(plan, use_prefect=not args.no_prefect)


def resume_ablation(
    store: RunStore, ablation_id: str, stored: dict[str, Any], prefect: bool
) -> int:
    """`itergrpo resume ABLATION_ID`: the suite and seeds the ablation was started with."""
    record = stored["ablation"]
    suite = suite_from_tree(record["spec"], f"the stored suite of {ablation_id}")
    plan = AblationPlan(
        ablation_id, record["suite"], suite, int(record["seeds"]), store.root, stored=True
    )
    return run_plan(plan, use_prefect=prefect)


def add_ablate_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "ablate",
        help="arms x seeds from one shared policy_0, with 95%% intervals and the paper's orderings",
        description="Run a suite of arms (configs/ablate/*.yaml) at several seeds, each an "
        "ordinary run starting from one shared warm start; print mean and 95% t-interval per "
        "arm and whether DeepSeekMath's RL orderings hold. Rerunning the command resumes.",
    )
    p.add_argument(
        "--suite",
        default="default",
        help=f"suite name ({', '.join(suite_names())}) or a suite YAML path (default: default)",
    )
    p.add_argument("--seeds", type=int, help="seeds per arm, >= 1 (default: the suite's)")
    p.add_argument(
        "--ablation-id",
        type=nonempty,
        help="the ablation's run id (default: ablate-<suite>); the same id resumes it",
    )
    store_option(p)
    p.add_argument(
        "--no-prefect", action="store_true", help="call the runs directly, without Prefect"
    )
    p.add_argument(
        "--no-fork",
        action="store_true",
        help="compute every arm-seed run in full, instead of starting one from the stages "
        "another run of the same seed already committed with the same settings",
    )
    p.set_defaults(func=cmd_ablate)
