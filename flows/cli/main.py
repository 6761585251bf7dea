"""Command-line entry point: `itergrpo <command>`.

Each subcommand is one `cmd_*` function plus an `add_*` function that declares its arguments,
registered in COMMANDS. Commands of modules that load torch and Prefect go in LAZY_COMMANDS
and are imported only when asked for, so `itergrpo sql` starts without loading either.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from flows.cli.store_commands import add_export, add_runs, add_sql, add_tables
from flows.progress import PACKAGE_LOGGERS
from grpo_core.contracts.errors import UserError

AddCommand = Callable[[Any], None]

# ---- registry -----------------------------------------------------------------------------

COMMANDS: dict[str, AddCommand] = {
    "sql": add_sql,
    "tables": add_tables,
    "runs": add_runs,
    "export": add_export,
}
# Commands of modules that load torch and Prefect, with their one-line help (shown by
# `itergrpo --help` without importing them): "module": ("function adding them", {name: help}).
LAZY_COMMANDS: dict[str, tuple[str, dict[str, str]]] = {
    "flows.cli.run_commands": (
        "add_run_commands",
        {
            "run": "run the iterative RL loop",
            "demo": "the built-in demo: warm start + 3 iterations on CPU",
            "resume": "resume a run from its stored config and artifacts",
            "report": "plots and a markdown summary of a run",
            "serve": "serve the flow as a Prefect deployment (UI-triggered runs)",
        },
    ),
    "flows.cli.ablate_commands": (
        "add_ablate_commands",
        {"ablate": "arms x seeds from one shared policy_0: the paper's RL orderings judged"},
    ),
}


def command_help(name: str) -> str:
    """The one-line help of a lazily imported command."""
    return next(helps[name] for _, helps in LAZY_COMMANDS.values() if name in helps)


def build_parser(command: str | None) -> argparse.ArgumentParser:
    """The parser; a lazy module is imported only when its own command runs (--help lists
    its commands from LAZY_COMMANDS, so it starts in a fraction of a second)."""
    parser = argparse.ArgumentParser(prog="itergrpo", description="Iterative GRPO runs and store.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in COMMANDS.values():
        add(sub)
    for module, (func, helps) in LAZY_COMMANDS.items():
        if command in helps:
            getattr(importlib.import_module(module), func)(sub)
        else:
            for name, text in helps.items():
                sub.add_parser(name, help=text, add_help=False)
    return parser


def main(argv: list[str] | None = None) -> int:
    args_list = sys.argv[1:] if argv is None else argv
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    # Per-file "Loading weights" bars from transformers would drown the stage bars.
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    # Our own progress lines (stage starts, metrics) are INFO; libraries stay at WARNING.
    for name in PACKAGE_LOGGERS:
        logging.getLogger(name).setLevel(logging.INFO)
    command = next((a for a in args_list if not a.startswith("-")), None)
    known = command in COMMANDS or any(command in h for _, h in LAZY_COMMANDS.values())
    parser = build_parser(command if known else None)
    try:
        args = parser.parse_args(args_list)
    except SystemExit as exc:
        return int(exc.code or 0) if isinstance(exc.code, int) else 2
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args))
    except UserError as exc:  # the user's to fix: one line; anything else is a bug (traceback)
        print(f"itergrpo {args.command}: error: {exc}", file=sys.stderr)
        return 2
