"""Time `replay_sample` on a synthetic PRM label history.

    python bench/replay_bench.py                 # 1M history rows
    python bench/replay_bench.py --rows 10000000 # 10M (building it takes a few minutes)

The history has `--iterations` committed iterations of equal size; the new iteration has as
many rows as one of them, and the replay mix is `--ratio` of new + replay.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from storage.replay import replay_count, replay_sample
from storage.store import RunStore

RUN_ID = "bench"
CHUNK = 500_000


def _labels(rng: np.random.Generator, start: int, n: int, pool: pa.Array) -> pa.Table:
    """n PRM label rows; step_text ~200 chars, unique per row."""
    ids = np.arange(start, start + n)
    problem = pa.array([f"p{i // 64:08d}" for i in ids])
    prefix = pa.array([f"{i}:" for i in ids])
    text = pc.binary_join_element_wise(prefix, pool.take(rng.integers(0, len(pool), n)), "")
    n_correct = rng.integers(0, 9, n).astype(np.int32)
    return pa.table(
        {
            "problem_id": problem,
            "sample_index": pa.array((ids // 8 % 8).astype(np.int32)),
            "step_index": pa.array((ids % 8).astype(np.int32)),
            "step_text": text,
            "step_end_token": pa.array(rng.integers(10, 1000, n).astype(np.int32)),
            "n_completions": pa.array(np.full(n, 8, np.int32)),
            "n_correct": pa.array(n_correct),
            "hard_label": pa.array((n_correct > 0).astype(np.int8)),
            "soft_label": pa.array(n_correct / 8.0),
        }
    )


def build_history(root: Path, rows: int, iterations: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    alphabet = np.frombuffer(b"abcdefghijklmnopqrstuvwxyz0123456789 +-*=\n", dtype=np.uint8)
    pool = pa.array(
        [bytes(rng.choice(alphabet, 196)).decode() for _ in range(4096)], type=pa.string()
    )
    per_iter = rows // iterations
    store = RunStore(root)
    with store.open_run(RUN_ID, {"bench": True}) as run:
        start = 0
        for k in range(iterations):
            with run.stage(k, "label") as attempt:
                for off in range(0, per_iter, CHUNK):
                    n = min(CHUNK, per_iter - off)
                    attempt.write("prm_labels", _labels(rng, start, n, pool))
                    start += n


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="history rows (all iterations)")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--ratio", type=float, default=0.10)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--store", type=Path, help="reuse/keep the history here (default: temp)")
    args = parser.parse_args(argv)

    tmp = None if args.store else Path(tempfile.mkdtemp(prefix="replay-bench-"))
    root = args.store or tmp
    assert root is not None
    try:
        store = RunStore(root)
        if not store.committed_files("prm_labels", run_id=RUN_ID):
            t0 = time.perf_counter()
            build_history(root, args.rows, args.iterations)
            print(f"built {args.rows:,} rows in {time.perf_counter() - t0:.1f} s at {root}")
        n_new = args.rows // args.iterations
        n_replay = replay_count(n_new, args.ratio, args.rows)
        times = []
        for seed in range(args.repeats):
            t0 = time.perf_counter()
            out = replay_sample(
                store,
                table="prm_labels",
                run_id=RUN_ID,
                before_iteration=args.iterations,
                n_new=n_new,
                ratio=args.ratio,
                seed=seed,
            )
            times.append(time.perf_counter() - t0)
            assert out.num_rows == n_replay, (out.num_rows, n_replay)
        print(
            f"replay_sample: history {args.rows:,} rows, n_new {n_new:,}, ratio {args.ratio} "
            f"-> {n_replay:,} replay rows; median {statistics.median(times):.3f} s "
            f"over {args.repeats} runs (min {min(times):.3f}, max {max(times):.3f})"
        )
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
