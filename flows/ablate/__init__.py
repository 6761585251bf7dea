"""`itergrpo ablate`: arms x seeds from one shared policy_0, each arm-seed an ordinary run.
suites.py (the suites and their plan), run.py (running what the store lacks), flow.py (the
Prefect flow), results.py and stats.py (the table and the verdicts), report.py (plots)."""
