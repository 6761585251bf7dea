"""The `itergrpo` command line: main.py parses and dispatches, store_commands.py (sql,
tables, runs), run_commands.py (run, demo, resume, report, serve) and ablate_commands.py."""

from flows.cli.main import main

__all__ = ["main"]
