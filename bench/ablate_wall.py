"""Wall time of `itergrpo ablate` (the default suite unless told otherwise), as a user runs it,
in a temporary store, with the machine-speed reference before and after.

    OMP_NUM_THREADS=2 .venv/bin/python bench/ablate_wall.py                 # through Prefect
    OMP_NUM_THREADS=2 .venv/bin/python bench/ablate_wall.py --no-prefect --suite micro

Target (issue 35): the default suite <= 20 minutes on the 2-core machine in a usual hour
(reference ~25 s). Besides the total it prints each arm-seed run's wall, read from the lines
the command logs ("[i/n] arm A, seed S: done in X s"), and the lines naming shared work
(the policy_0 warm start, forked stages).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine_speed import reference_line

DONE = re.compile(r"\] (arm \S+, seed \d+): done in (\d+) s")
SHARED = re.compile(r"policy_0 done in|forked|already committed")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--suite", default="default")
    parser.add_argument("--no-prefect", action="store_true")
    args = parser.parse_args()
    print(reference_line(), flush=True)
    itergrpo = Path(sys.executable).with_name("itergrpo")
    with tempfile.TemporaryDirectory(prefix="ablate-wall-") as tmp:
        command = [str(itergrpo), "ablate", "--suite", args.suite, "--store", tmp]
        command += ["--no-prefect"] if args.no_prefect else []
        start = time.perf_counter()
        done = subprocess.run(command, capture_output=True, text=True)
        wall = time.perf_counter() - start
    log = done.stdout + done.stderr
    if done.returncode != 0:
        print(log[-4000:])
        raise SystemExit(f"itergrpo ablate exited {done.returncode}")
    for line in log.splitlines():
        if DONE.search(line) or SHARED.search(line):
            print("  " + line.split("itergrpo:", 1)[-1].strip())
    mode = "direct calls" if args.no_prefect else "Prefect"
    print(
        f"RESULT ablate --suite {args.suite} ({mode}): {wall:.0f} s = {wall / 60:.1f} min "
        "(target <= 20 min for the default suite)",
        flush=True,
    )
    lines = done.stdout.splitlines()
    first = next((i for i, line in enumerate(lines) if line.startswith("arm ")), len(lines))
    print("\n".join(lines[first:]))  # the command's own tables and verdicts
    print(reference_line(), flush=True)


if __name__ == "__main__":
    main()
