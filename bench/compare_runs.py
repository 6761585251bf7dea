"""Whether two runs of one config are the same run: every committed row of the data tables,
`eval` and `metrics` (less the figures that measure the machine: wall times, memory), and the
weights of every stored checkpoint (policies, reward models, PPO's critic; not the GRPO
stage's progress scratch). Used to compare
a run killed with SIGKILL and resumed (bench/kill_resume_demo.sh) with an uninterrupted one.

    python bench/compare_runs.py STORE_A RUN_A STORE_B RUN_B

Prints one line per table and checkpoint kind, and exits 1 if anything differs.
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any

from safetensors.torch import load_file

from flows.names import GRPO_PROGRESS
from grpo_core.engines.cost import MEASURED_METRICS
from storage.store import RunStore

TABLES = ("prompts", "rollouts", "orm_labels", "prm_labels", "rm_train", "policy_samples")
TABLES += ("eval", "metrics")
# what measures the machine, not the run: the GRPO stage's cost figures, the warm start's wall
MACHINE_FIGURES = MEASURED_METRICS | {"seconds"}


def _same_run(value: Any, run_id: str) -> Any:
    """NaN as text (it is unequal to itself); a path naming the run without its id."""
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    if isinstance(value, str):
        return value.replace(f"/{run_id}/", "/<run>/")
    return value


def _rows(store: RunStore, run_id: str, table: str) -> dict[int, list[tuple[Any, ...]]]:
    """iteration -> the table's rows of it without run_id, sorted."""
    rows = store.read(table, run_id=run_id).drop(["run_id"]).to_pylist()
    if table == "metrics":
        rows = [r for r in rows if r["name"] not in MACHINE_FIGURES]
    out: dict[int, list[tuple[Any, ...]]] = {}
    for r in rows:
        cells = {k: _same_run(v, run_id) for k, v in r.items()}
        out.setdefault(int(r["iteration"]), []).append(tuple(sorted(cells.items())))
    return {k: sorted(v, key=repr) for k, v in sorted(out.items())}


def _weights(run_dir: Path) -> dict[str, dict[str, Any]]:
    """role/iter-k/file -> tensors of every safetensors file under the run's checkpoints."""
    return {
        str(path.relative_to(run_dir)): load_file(str(path))
        for path in sorted(run_dir.rglob("*.safetensors"))
        if path.relative_to(run_dir).parts[0] != GRPO_PROGRESS  # the stage's scratch
    }


def compare(store_a: Path, run_a: str, store_b: Path, run_b: str) -> bool:
    """Print what matches and what does not; True when everything does."""
    a, b = RunStore(store_a), RunStore(store_b)
    same = True
    for table in TABLES:
        rows_a, rows_b = _rows(a, run_a, table), _rows(b, run_b, table)
        differ = [k for k in sorted({*rows_a, *rows_b}) if rows_a.get(k) != rows_b.get(k)]
        same &= not differ
        count_a, count_b = (sum(map(len, rows.values())) for rows in (rows_a, rows_b))
        shown = f"DIFFER at iterations {differ}" if differ else "equal"
        print(f"{table:<15} {count_a:>7} rows vs {count_b:>7}: {shown}")
    weights_a = _weights(store_a / "checkpoints" / run_a)
    weights_b = _weights(store_b / "checkpoints" / run_b)
    for role in sorted({name.split("/")[0] for name in (*weights_a, *weights_b)}):
        files = sorted(n for n in {*weights_a, *weights_b} if n.startswith(role + "/"))
        changed = [
            n
            for n in files
            if n not in weights_a
            or n not in weights_b
            or weights_a[n].keys() != weights_b[n].keys()
            or any(not weights_a[n][k].equal(weights_b[n][k]) for k in weights_a[n])
        ]
        same &= not changed
        shown = "equal" if not changed else f"DIFFER: {', '.join(changed)}"
        print(f"{role:<15} {len(files):>7} weight files: {shown}")
    return same


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("store_a", type=Path)
    parser.add_argument("run_a")
    parser.add_argument("store_b", type=Path)
    parser.add_argument("run_b")
    args = parser.parse_args()
    return 0 if compare(args.store_a, args.run_a, args.store_b, args.run_b) else 1


if __name__ == "__main__":
    sys.exit(main())
