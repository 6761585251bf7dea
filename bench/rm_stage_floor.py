"""How far the demo's reward-model stage can shrink: ORM_0 and PRM_0 trained on the demo's
iteration-0 labels under variants of the reward_models settings, each with its wall and the
AUROCs the stage stores (fresh outputs of policy_0, GRPO's questions and new ones).

    OMP_NUM_THREADS=2 .venv/bin/python bench/rm_stage_floor.py
    OMP_NUM_THREADS=2 .venv/bin/python bench/rm_stage_floor.py \
        --variant "reward_models.batch_size=16 reward_models.epochs=1"

The demo's warm start, rollout and labelling of iteration 0 run once into a temporary store;
each variant then trains on a copy of it (the stage's own code: `_train_one`, then the drift
measurement), so every variant sees the same labels. The machine-speed reference is printed
before and after. The bar the demo keeps: ORM AUROC >= 0.85 every iteration, and the issue's
"within 0.01" of the preset's own figures.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

from machine_speed import reference_line

from flows.config_files import load_config
from flows.context import RunContext
from flows.guards import GuardChecks
from flows.loop import call_directly
from flows.names import LABEL, ORM, PRM, ROLLOUT, WARM_START
from flows.runtime import apply_threads
from flows.stages import STAGES, train_rm
from storage.store import RunStore

RUN_ID = "rm-floor"
DEFAULT_VARIANTS = (
    "",  # the demo preset as it is
    "reward_models.epochs=1",
    "reward_models.batch_size=16 reward_models.epochs=1 reward_models.prm_epochs=5",
    "reward_models.prm_epochs=5",
)


def labelled_store(root: Path) -> None:
    """The demo's stages up to iteration 0's labels, committed in `root`."""
    cfg = load_config("demo", [f"store.root={root}", f"run.run_id={RUN_ID}"])
    apply_threads(cfg.run.num_threads)
    store = RunStore(root)
    with store.open_run(RUN_ID, cfg.model_dump(mode="json")) as record:
        ctx = RunContext(cfg, store, record)
        try:
            for name in (WARM_START, ROLLOUT, LABEL):
                call_directly(ctx)(name, 0, STAGES[name].fn)
        finally:
            ctx.close()


def train_variant(root: Path, overrides: list[str]) -> str:
    cfg = load_config("demo", [*overrides, f"store.root={root}", f"run.run_id={RUN_ID}"])
    apply_threads(cfg.run.num_threads)
    store = RunStore(root)
    with store.open_run(RUN_ID, cfg.model_dump(mode="json"), force_config=True) as record:
        ctx = RunContext(cfg, store, record)
        try:
            checks, figures = GuardChecks(cfg.guards, RUN_ID), []
            for kind in (ORM, PRM):
                start = time.perf_counter()
                metrics, _ = train_rm._train_one(ctx, kind, 0, checks)
                figures.append(
                    f"{kind} {time.perf_counter() - start:5.1f} s ({metrics['steps']:.0f} steps)"
                )
            model, tokenizer = ctx.policy(0)
            aurocs = train_rm.auroc_metrics(train_rm.rm_drift_rows(ctx, 0, model, tokenizer))
        finally:
            ctx.close()
    shown = " ".join(f"{name} {value:.3f}" for name, value in sorted(aurocs.items()))
    return f"{', '.join(figures)}; {shown}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", action="append", help="space-separated --set overrides")
    args = parser.parse_args()
    variants = args.variant or list(DEFAULT_VARIANTS)
    print(reference_line(), flush=True)
    with tempfile.TemporaryDirectory(prefix="rm-floor-") as tmp:
        base = Path(tmp) / "labelled"
        labelled_store(base)
        for variant in variants:
            copy = Path(tmp) / "variant"
            shutil.rmtree(copy, ignore_errors=True)
            shutil.copytree(base, copy)
            line = train_variant(copy, variant.split())
            print(f"RESULT [{variant or 'demo preset'}] {line}", flush=True)
    print(reference_line(), flush=True)


if __name__ == "__main__":
    main()
