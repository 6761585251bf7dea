"""CLI commands that run the pipeline: run, resume, demo, serve, report."""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shlex
import sys
import time
from pathlib import Path

from flows.cli.main import command_help
from flows.cli.options import nonempty, store_option
from flows.config import ItergrpoConfig
from flows.config_files import (
    load_config,
    parse_override,
    preset_names,
    set_path,
    stored_config_migrated,
    validate_config,
)
from flows.figures import DEFAULT_DPI, FIGURE_FORMATS, FigureOutput
from flows.interrupts import RunInterrupted
from flows.names import default_run_id
from flows.policy_change import format_policy_change, policy_change
from flows.preflight import preflight
from flows.report import format_iteration_table, iteration_table, sql_hint, write_report
from grpo_core.contracts.errors import UserError
from storage.store import RunStore, resolve_store_root

log = logging.getLogger("itergrpo")


def _quiet_prefect_env() -> None:
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("DO_NOT_TRACK", "1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _with_identity(cfg: ItergrpoConfig, run_id: str | None, store: str | None) -> ItergrpoConfig:
    """`cfg` with its run id and the store this command resolved (resolve_store_root)."""
    tree = cfg.model_dump(mode="json")
    if run_id:
        tree["run"]["run_id"] = run_id
    tree["store"]["root"] = str(resolve_store_root(store, tree["store"]["root"]))
    if not tree["run"]["run_id"]:
        tree["run"]["run_id"] = default_run_id(tree.get("task", {}).get("name", "run"))
    return validate_config(tree)


class _NoUserErrorTraceback(logging.Filter):
    """Prefect logs a failed task/flow with its traceback; for a user error the one-line
    message says all (the CLI prints it again at the end), so the traceback is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:

        if record.exc_info and isinstance(record.exc_info[1], (UserError, RunInterrupted)):
            record.exc_info, record.exc_text = None, None
        return True


def _import_pipeline(prefect: bool) -> None:
    """Import torch, transformers, the stages (and Prefect's flow): seconds of work, done only
    for a run that can start."""
    from transformers.utils import logging as hf_logging

    for module in ("flows.loop", "flows.prefect_flow") if prefect else ("flows.loop",):
        importlib.import_module(module)
    # transformers draws a bar per checkpoint load/save; the stage bars are the useful ones.
    hf_logging.disable_progress_bar()


def _execute(cfg: ItergrpoConfig, *, use_prefect: bool, force_config: bool) -> bool:
    """Run `cfg`; whether the run wrote its report (the Prefect flow does, for its artifact)."""
    if use_prefect:
        from flows.prefect_server import prefect_api

        def prepare() -> None:  # a refusal is one clean line: nothing reached Prefect yet
            preflight(cfg, force_config=force_config)
            _import_pipeline(prefect=True)

        # The checks and imports take seconds, mostly on one core: run while a server boots.
        with prefect_api(while_starting=prepare):
            from flows.prefect_flow import iterative_rl, raise_for_flow_state

            for name in ("prefect.flow_runs", "prefect.task_runs"):
                logging.getLogger(name).addFilter(_NoUserErrorTraceback())
            state = iterative_rl(cfg, force_config=force_config, return_state=True)
        raise_for_flow_state(state, "interrupted")
        return True
    preflight(cfg, force_config=force_config)
    _import_pipeline(prefect=False)
    from flows.loop import execute_run

    execute_run(cfg, force_config=force_config)
    return False


def _print_results(store: RunStore, run_id: str) -> None:
    """The per-policy table, then what RL changed from policy_0 (paired by problem)."""
    print(format_iteration_table(iteration_table(store, run_id)))
    change = policy_change(store, run_id)
    if change is not None:
        print("\n" + format_policy_change(change))


def _finish(cfg: ItergrpoConfig, seconds: float, report_written: bool) -> None:
    assert cfg.run.run_id is not None
    store = RunStore(cfg.store.resolved_root())
    print()
    _print_results(store, cfg.run.run_id)
    report_dir = store.root / "reports" / cfg.run.run_id
    if not report_written:
        write_report(store, cfg.run.run_id, report_dir)
    print(f"\nrun {cfg.run.run_id} finished in {seconds:.0f} s")
    print(f"store:  {store.root.resolve()}")
    print(f"report: {report_dir.resolve()}")
    print(f"query:  {sql_hint(store, cfg.run.run_id)}")


def _run_config(cfg: ItergrpoConfig, args: argparse.Namespace) -> int:

    start = time.perf_counter()
    try:
        report_written = _execute(
            cfg, use_prefect=not args.no_prefect, force_config=args.force_config
        )
    except (RunInterrupted, KeyboardInterrupt) as exc:
        # KeyboardInterrupt: a Ctrl-C outside the run's own handler (during start-up or
        # clean-up); the run, if it began, is `interrupted` and resumable all the same.
        assert cfg.run.run_id is not None  # _with_identity picked one
        root = cfg.store.resolved_root()
        reason = str(exc) or "interrupted by SIGINT"
        if not RunStore(root).run_dir(cfg.run.run_id).joinpath("status.json").exists():
            print(f"{reason} before the run started; nothing was written", file=sys.stderr)
            return 130
        store = shlex.quote(str(root))
        print(f"{reason}: itergrpo resume {cfg.run.run_id} --store {store}", file=sys.stderr)
        return 130
    _finish(cfg, time.perf_counter() - start, report_written)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    cfg = load_config(args.config, args.set or [])
    return _run_config(_with_identity(cfg, args.run_id, args.store), args)


def cmd_demo(args: argparse.Namespace) -> int:
    cfg = load_config("demo", args.set or [])
    print("itergrpo demo: built-in arithmetic task, tiny policy, warm start + iterations")
    return _run_config(_with_identity(cfg, args.run_id, args.store), args)


def cmd_resume(args: argparse.Namespace) -> int:
    store = RunStore(args.store)
    stored = store.run_config(args.run_id)
    if "ablation" in stored:  # an `itergrpo ablate` run: its suite and seeds, all its runs
        from flows.cli.ablate_commands import resume_ablation

        return resume_ablation(store, args.run_id, stored, prefect=not args.no_prefect)
    tree = stored_config_migrated(stored)
    for item in args.set or []:  # a corrected field: refused if a committed stage read it
        key, value = parse_override(item)
        set_path(tree, key, value)
    cfg = validate_config(tree)
    # The run continues in the store it was found in, wherever its config says it started.
    cfg = _with_identity(cfg, args.run_id, str(store.root))
    args.force_config = False
    return _run_config(cfg, args)


def cmd_report(args: argparse.Namespace) -> int:
    output = FigureOutput(tuple(args.format or ("png",)), args.dpi)
    store = RunStore(args.store).require_existing()
    store.run_status(args.run_id)  # an unknown run is an error, not empty plots
    out = Path(args.out) if args.out else store.root / "reports" / args.run_id
    _print_results(store, args.run_id)
    for path in write_report(store, args.run_id, out, output):
        print(f"wrote {path}")
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    from flows.serving import serve_until_stopped, served_api

    cfg = load_config(args.config, args.set or [])
    api = served_api()  # refused at once, with the commands to run, when there is none
    from flows.prefect_flow import SERVED_CONFIG_ENV, iterative_rl

    # UI-triggered runs write where this command would have: resolved once, here.
    root = resolve_store_root(args.store, cfg.store.root)
    cfg = validate_config({**cfg.model_dump(mode="json"), "store": {"root": str(root)}})
    # Flow runs are child processes of this one: they merge partial parameters onto this.
    os.environ[SERVED_CONFIG_ENV] = json.dumps(cfg.model_dump(mode="json"))
    deployment = f"{iterative_rl.name}/{args.name}"

    def serving(ui: str | None) -> None:
        print(f"itergrpo serve: deployment {deployment} on {api}, runs write to {root}")
        if ui:
            print(f"UI: {ui} (Run -> Custom run)")
        print(f"or: prefect deployment run {deployment!r}; stop with Ctrl-C or SIGTERM", flush=True)

    stopped_by = serve_until_stopped(
        iterative_rl,
        name=args.name,
        on_serving=serving,
        cron=args.cron,
        parameters={"config": cfg.model_dump(mode="json")},
        description="Iterative GRPO with reward-model retraining (DeepSeekMath Algorithm 1)",
        tags=["itergrpo"],
    )
    print(
        f"itergrpo serve: stopped by {stopped_by} ({deployment} stays registered; its "
        "schedule, if any, is paused)",
        file=sys.stderr,
    )
    return 0


def _run_options(p: argparse.ArgumentParser, *, config: bool = True) -> None:
    if config:
        p.add_argument("--config", help=f"YAML file or preset name: {', '.join(preset_names())}")
        p.add_argument(
            "--set", action="append", metavar="KEY=VALUE", help="override, e.g. grpo.steps=20"
        )
    store_option(p)
    p.add_argument(
        "--no-prefect", action="store_true", help="call the stages directly, without Prefect"
    )


def add_run_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("run", help=command_help("run"))
    _run_options(p)
    p.add_argument("--run-id", type=nonempty, help="run id; reusing one resumes it")
    p.add_argument(
        "--force-config", action="store_true", help="reuse a run id with a different config"
    )
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("demo", help=command_help("demo"))
    _run_options(p)
    p.add_argument("--run-id", type=nonempty, help="run id (default: demo-<time>)")
    p.set_defaults(func=cmd_demo, force_config=False, config=None)

    p = sub.add_parser("resume", help=command_help("resume"))
    p.add_argument("run_id")
    _run_options(p, config=False)
    p.add_argument(
        "--set",
        action="append",
        metavar="KEY=VALUE",
        help="correct a field no committed stage read (docs/failures.md), e.g. "
        "guards.rm_labels=warn",
    )
    p.set_defaults(func=cmd_resume)

    p = sub.add_parser("report", help=command_help("report"))
    p.add_argument("run_id")
    store_option(p)
    p.add_argument("--out", help="output directory (default <store>/reports/<run_id>)")
    p.add_argument(
        "--format",
        action="append",
        choices=FIGURE_FORMATS,
        help="figure file format, repeat for several (default png; pdf and svg are vector)",
    )
    p.add_argument(
        "--dpi", type=int, default=DEFAULT_DPI, help=f"PNG resolution (default {DEFAULT_DPI})"
    )
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("serve", help=command_help("serve"))
    p.add_argument("--config", default="demo", help="default parameters: YAML file or preset")
    p.add_argument("--set", action="append", metavar="KEY=VALUE")
    store_option(p)
    p.add_argument("--name", default="itergrpo", help="deployment name")
    p.add_argument("--cron", help="cron schedule, e.g. '0 2 * * *'")
    p.set_defaults(func=cmd_serve)
