"""What each arm paid for its accuracy: the cost figures of the GRPO stage that trained each
policy (grpo_core/engines/cost.py records them per run) as `ablation` rows, and the "cost per
arm" table (means over seeds) printed beside the results table."""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from flows.ablate.results import Values, text_table
from grpo_core.engines.cost import PEAK_MEMORY_MIB, STEP_SECONDS, TRAINING_STATE_MIB

S_PER_STEP = "grpo_s_per_step"  # the median of the stage's step_seconds
PEAK_MIB = "grpo_peak_memory_mib"
STATE_MIB = "grpo_training_state_mib"
COST_COLUMNS = ((S_PER_STEP, "s/step"), (PEAK_MIB, "peak MiB"), (STATE_MIB, "state MiB"))
COST_NOTE = (
    "Cost of the GRPO stage that trained each policy, mean over seeds: s/step is the median "
    "wall time of a step (sampling, reward, update; PPO's critic update included), peak MiB "
    "the stage's peak memory (on CPU the rise of the process's resident set during the stage, "
    "on CUDA max_memory_allocated), state MiB the weights, gradients and AdamW moments of the "
    "policy (and PPO's critic). Wall times are only comparable within one run of a suite."
)


def stage_costs(grpo_metric_rows: Iterable[Mapping[str, Any]]) -> dict[int, dict[str, float]]:
    """policy_iteration k+1 -> the cost of iteration k's GRPO stage (the one that trained
    it), from that stage's `metrics` rows: median step_seconds, peak memory, training state
    (a stage that recorded none of them, e.g. stored by an older version, is left out)."""
    steps: dict[int, list[float]] = defaultdict(list)
    out: dict[int, dict[str, float]] = defaultdict(dict)
    for r in grpo_metric_rows:
        policy = int(r["iteration"]) + 1
        if r["name"] == STEP_SECONDS and r["step"] is not None:
            steps[policy].append(float(r["value"]))
        elif r["name"] == PEAK_MEMORY_MIB and r["step"] is None:
            out[policy][PEAK_MIB] = float(r["value"])
        elif r["name"] == TRAINING_STATE_MIB and r["step"] is None:
            out[policy][STATE_MIB] = float(r["value"])
    for policy, seconds in steps.items():
        out[policy][S_PER_STEP] = statistics.median(seconds)
    return dict(out)


def cost_table(values: Values) -> list[dict[str, Any]]:
    """One row per arm and policy it trained that has cost rows: each cost figure's mean over
    seeds (None where no seed has it) and the number of seeds."""
    rows = []
    for arm in values.arms():
        for policy in values.iterations(arm):
            found = {name: values.seeds(arm, policy, name) for name, _ in COST_COLUMNS}
            if policy == 0 or not any(found.values()):
                continue
            cells: dict[str, Any] = {"arm": arm, "policy": policy}
            for name, per_seed in found.items():
                cells[name] = statistics.fmean(per_seed.values()) if per_seed else None
            cells["seeds"] = max(len(per_seed) for per_seed in found.values())
            rows.append(cells)
    return rows


def format_cost_table(values: Values) -> str:
    """The cost table as text ("" when the ablation has no cost rows)."""
    rows = cost_table(values)
    if not rows:
        return ""
    heads = ["arm", "policy", "seeds", *(head for _, head in COST_COLUMNS)]
    shown = {S_PER_STEP: "{:.2f}", PEAK_MIB: "{:.0f}", STATE_MIB: "{:.1f}"}
    cells = [
        [
            r["arm"],
            str(r["policy"]),
            str(r["seeds"]),
            *("-" if r[n] is None else shown[n].format(r[n]) for n, _ in COST_COLUMNS),
        ]
        for r in rows
    ]
    return text_table(heads, cells)
