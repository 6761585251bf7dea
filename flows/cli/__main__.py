"""`python -m flows.cli ...`: the `itergrpo` command."""

from flows.cli.main import main

raise SystemExit(main())
