"""`python -m tests.cli_shared_warm_starts ARGS`: the `itergrpo` command with its warm starts
shared through the test run's cache (tests/warm_start_cache.py), when the test run set one."""

import os
from pathlib import Path

from tests.warm_start_cache import ENV, install

if os.environ.get(ENV):
    install(Path(os.environ[ENV]))

from flows.cli.main import main

raise SystemExit(main())
