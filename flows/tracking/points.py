"""What a tracker is sent, read from the store: the flattened config (params) and one committed
stage's rows as metric points at the step they belong to (the global GRPO step, or the policy's
iteration). Pure functions but `stage_points`, which reads the store."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from flows.stage_table import STAGES
from storage.store import RunStore

# MLflow accepts letters, digits, '_', '-', '.', ' ', '/' (and ':' off Windows) in a key.
_KEY_UNSAFE = re.compile(r"[^\w.\- /]")


@dataclass(frozen=True)
class MetricPoint:
    """One value of one metric at one step."""

    key: str
    value: float
    step: int


def flatten_config(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Dotted keys to text values (`grpo.algo.lr` -> '0.0001'): strings as they are, anything
    else as JSON (true, null, [1, 2]); an empty section is kept as '{}'."""
    flat: dict[str, str] = {}
    for name, value in tree.items():
        key = f"{prefix}.{name}" if prefix else str(name)
        if isinstance(value, Mapping) and value:
            flat.update(flatten_config(value, key))
        else:
            flat[key] = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return flat


def global_step(iteration: int, step: int, steps_per_iteration: int) -> int:
    """The GRPO step counted over the whole run, so curves keep rising across iterations."""
    if not 0 <= step < steps_per_iteration:
        raise ValueError(f"GRPO step {step} outside 0..{steps_per_iteration - 1}")
    if iteration < 0:
        raise ValueError(f"iteration {iteration} < 0")
    return iteration * steps_per_iteration + step


def metric_key(*parts: str) -> str:
    """A key MLflow and TensorBoard both accept: parts joined by '/', '@' spelled '_at_' and
    any other character outside [A-Za-z0-9_.- ] replaced by '_'."""
    return "/".join(_KEY_UNSAFE.sub("_", p.replace("@", "_at_")) for p in parts)


def eval_metric_name(metric: str, k: int | None) -> str:
    """'pass@k' at k=4 -> 'pass@4'. A metric without '@k' keeps its name: its k is fixed
    within a run (1 for greedy accuracy, the N of best-of-N)."""
    return metric.replace("@k", f"@{k}") if k is not None else metric


def stage_policy_iteration(stage: str, iteration: int) -> int:
    """The policy a stage's per-iteration values describe, as it declares (policy_offset): the
    evaluation of iteration k measures policy_{k+1}; the warm start (iteration 0) policy_0;
    the other stages sample policy_k."""
    return iteration + STAGES[stage].policy_offset


def stage_points(
    store: RunStore, run_id: str, stage: str, iteration: int, grpo_steps: int
) -> list[MetricPoint]:
    """Every value the committed `stage` of `iteration` stored: its `metrics` rows (a step's
    at its global step where the stage's metrics are per step, as GRPO's; the rest at the
    policy's iteration) and its `eval` rows (at their policy_iteration)."""
    policy = stage_policy_iteration(stage, iteration)
    per_step = STAGES[stage].metrics_per_step
    points = []
    metrics = store.read("metrics", run_id=run_id, iterations=[iteration], stage=stage)
    for row in metrics.to_pylist():
        if per_step and row["step"] is not None:
            step = global_step(iteration, int(row["step"]), grpo_steps)
        else:
            step = policy
        points.append(MetricPoint(metric_key(stage, row["name"]), float(row["value"]), step))
    evals = store.read("eval", run_id=run_id, iterations=[iteration], stage=stage)
    for row in evals.to_pylist():
        name = eval_metric_name(str(row["metric"]), row["k"])
        key = metric_key("eval", str(row["split"]), name)
        points.append(MetricPoint(key, float(row["value"]), int(row["policy_iteration"])))
    return points


def duration_point(stage: str, iteration: int, seconds: float) -> MetricPoint:
    """How long a stage took (the loop measures it: the commit log holds only the write)."""
    return MetricPoint(
        metric_key("duration_s", stage), seconds, stage_policy_iteration(stage, iteration)
    )
