"""Run reports: the per-iteration table, a markdown summary and plots, from the store."""

from __future__ import annotations

import shlex
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.eval_values import GREEDY, SAMPLED
from flows.figures import (
    FigureOutput,
    inline_pngs,
    interval_errors,
    legend_outside,
    mark_iterations,
    new_figure,
    picture_lines,
    policy_axis,
    pyplot,
    save_figure,
)
from flows.guard_report import guard_lines
from flows.names import EVAL_SPLIT, TRAIN_SPLIT
from flows.policy_change import format_policy_change, policy_change
from storage.store import RunStore

# Columns of the per-iteration table, in display order: (key, header).
TABLE_COLUMNS = (
    ("policy", "policy"),
    ("greedy_acc", "greedy acc"),
    ("sample_acc", "sampled acc"),
    ("maj", "Maj@K"),
    ("pass", "Pass@K"),
    ("orm_auroc", "ORM AUROC"),
    ("orm_auroc_stale", "ORM stale"),
    ("prm_step_auroc", "PRM AUROC"),
    ("prm_step_auroc_stale", "PRM stale"),
    ("orm_auroc_new_questions", "ORM new q"),
    ("rm_reward", "RM reward"),
    ("verifier_acc", "verifier acc"),
    ("kl", "KL"),
)
# What the columns mean, under the table (README and summary.md).
TABLE_NOTE = (
    "AUROCs: the reward models of iteration k (ORM, PRM steps against exact labels) on fresh "
    "outputs of policy k that they never trained on, for the train-split questions GRPO "
    "draws its prompts from (what they reward); 'stale' is the k-1 models on the same "
    "outputs, the RMs you would have without retraining; 'ORM new q' is the ORM on fresh "
    "outputs for test-split questions no stage trains on. RM reward, verifier acc and KL: "
    "means over the GRPO steps that produced policy k (what the learned RMs paid vs what the "
    "verifier says of the same samples; KL per token, the one the run applies: GRPO's loss "
    "term or PPO's reward penalty, '-' where it applies none). Accuracies: test split."
)
DRIFT_METRICS = ("orm_auroc", "orm_auroc_stale", "prm_step_auroc", "prm_step_auroc_stale")
# z of a two-sided 95% normal interval: AUROC intervals of stores written before the
# bootstrap ones, from their stored (Hanley-McNeil) standard errors.
Z95 = 1.959964


def _eval_by_policy(store: RunStore, run_id: str) -> dict[str, dict[int, dict[str, float]]]:
    """Eval values per split and policy: `metric` for K-free metrics, `pass@4` style names
    for per-K ones, `<name>_se` for their standard errors and `<name>_lo` / `<name>_hi` for
    their 95% intervals where stored."""
    table = store.read("eval", run_id=run_id)
    out: dict[str, dict[int, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for row in table.to_pylist():
        name = row["metric"]
        if name.endswith("@k"):
            name = f"{name[:-2]}@{row['k']}"
        values = out[row["split"]][int(row["policy_iteration"])]
        values[name] = float(row["value"])
        if row["stderr"] is not None:
            values[f"{name}_se"] = float(row["stderr"])
        if row.get("ci_low") is not None and row.get("ci_high") is not None:
            values[f"{name}_lo"], values[f"{name}_hi"] = float(row["ci_low"]), float(row["ci_high"])
    return out


def _auroc_interval(values: dict[str, float], name: str) -> tuple[float, float] | None:
    """The stored 95% interval of an AUROC; for stores before intervals were stored, the
    normal one from its standard error (clipped to [0, 1]); None without either."""
    if f"{name}_lo" in values:
        return values[f"{name}_lo"], values[f"{name}_hi"]
    if name in values and f"{name}_se" in values:
        half = Z95 * values[f"{name}_se"]
        return max(values[name] - half, 0.0), min(values[name] + half, 1.0)
    return None


def _grpo_means(store: RunStore, run_id: str) -> dict[int, dict[str, float]]:
    """Mean GRPO-stage reward and KL of iteration k (they produced policy k+1)."""
    table = store.read("metrics", run_id=run_id, where="stage = 'grpo' AND step IS NOT NULL")
    sums: dict[int, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for row in table.to_pylist():
        sums[int(row["iteration"])][row["name"]].append(float(row["value"]))
    return {
        k: {name: sum(vals) / len(vals) for name, vals in by_name.items() if vals}
        for k, by_name in sums.items()
    }


def _largest_k(metrics: dict[str, float], prefix: str) -> tuple[int, float] | None:
    found = [
        (int(name.split("@", 1)[1]), value)
        for name, value in metrics.items()
        if name.startswith(prefix + "@") and name.split("@", 1)[1].isdigit()
    ]
    return max(found) if found else None


def iteration_table(store: RunStore, run_id: str) -> list[dict[str, Any]]:
    """One row per evaluated policy: policy_0 (before RL), then policy_k+1 after iteration k."""
    by_split = _eval_by_policy(store, run_id)
    evals = by_split[EVAL_SPLIT]
    rewarded = by_split[TRAIN_SPLIT]  # RM drift on GRPO's questions
    grpo = _grpo_means(store, run_id)
    rows = []
    for policy in sorted(evals):
        metrics, drift = evals[policy], rewarded.get(policy, {})
        maj = _largest_k(metrics, "maj")
        pas = _largest_k(metrics, "pass")
        trained_by = grpo.get(policy - 1, {})
        rows.append(
            {
                "policy": policy,
                "greedy_acc": metrics.get(GREEDY),
                "greedy_acc_se": metrics.get(f"{GREEDY}_se"),
                "sample_acc": metrics.get(SAMPLED),
                "maj": maj[1] if maj else None,
                "maj_se": metrics.get(f"maj@{maj[0]}_se") if maj else None,
                "maj_k": maj[0] if maj else None,
                "pass": pas[1] if pas else None,
                "pass_k": pas[0] if pas else None,
                **{name: drift.get(name) for name in DRIFT_METRICS},
                **{f"{name}_ci": _auroc_interval(drift, name) for name in DRIFT_METRICS},
                "orm_auroc_new_questions": metrics.get("orm_auroc"),
                "orm_auroc_new_questions_ci": _auroc_interval(metrics, "orm_auroc"),
                "reward": trained_by.get("reward_mean"),
                "rm_reward": trained_by.get("rm_reward_mean"),
                "verifier_acc": trained_by.get("verifier_accuracy"),
                "kl": trained_by.get("kl"),
            }
        )
    return rows


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}"
    return str(value)


def _cell(row: dict[str, Any], key: str) -> str:
    """The value, with its standard error when the row has one (`0.512±0.022`)."""
    se = row.get(f"{key}_se")
    return _fmt(row[key]) + (f"±{se:.3f}" if se is not None and row[key] is not None else "")


def _headers(rows: list[dict[str, Any]]) -> list[str]:
    heads = []
    for key, head in TABLE_COLUMNS:
        k = rows[0].get(f"{key}_k") if rows else None
        heads.append(head.replace("@K", f"@{k}") if k else head)
    return heads


def format_iteration_table(rows: list[dict[str, Any]]) -> str:
    """The per-iteration table as plain text for the terminal (`iteration_table` rows)."""
    if not rows:
        return "(no evaluation rows yet)"
    heads = _headers(rows)
    cells = [[_cell(r, key) for key, _ in TABLE_COLUMNS] for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, h in enumerate(heads)]
    lines = ["  ".join(h.rjust(w) for h, w in zip(heads, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join(lines)


def summary_markdown(store: RunStore, run_id: str) -> str:
    rows = iteration_table(store, run_id)
    text = [f"# itergrpo run `{run_id}`", ""]
    if rows:
        heads = _headers(rows)
        text.append("| " + " | ".join(heads) + " |")
        text.append("|" + "---|" * len(heads))
        for r in rows:
            text.append("| " + " | ".join(_cell(r, key) for key, _ in TABLE_COLUMNS) + " |")
        first, last = rows[0], rows[-1]
        text += [
            "",
            f"policy_0 -> policy_{last['policy']}: greedy accuracy "
            f"{_fmt(first['greedy_acc'])} -> {_fmt(last['greedy_acc'])}, "
            f"Maj@K {_fmt(first['maj'])} -> {_fmt(last['maj'])}, "
            f"Pass@K {_fmt(first['pass'])} -> {_fmt(last['pass'])}.",
        ]
        change = policy_change(store, run_id)
        if change is not None:
            text += ["", format_policy_change(change).replace("\n", "  \n")]
        text += ["", TABLE_NOTE]
    else:
        text.append("No evaluation rows yet.")
    guards = guard_lines(store, run_id)
    text += ["", *guards] if guards else []
    text += ["", f"Inspect with SQL: `{sql_hint(store, run_id)}`"]
    return "\n".join(text) + "\n"


def sql_hint(store: RunStore, run_id: str) -> str:
    """A command that queries this run, pasteable from any shell (the store named)."""
    query = f"SELECT * FROM eval WHERE run_id = '{run_id}'"
    # Run ids are [A-Za-z0-9._-]: the query is safe inside double quotes.
    return f'itergrpo sql "{query}" --store {shlex.quote(str(store.root))}'


def report_figures(store: RunStore, run_id: str) -> dict[str, Any]:
    """The report's matplotlib figures by file stem: accuracy, reward and KL, RM AUROC per
    policy; RM reward vs verifier per GRPO step."""
    plt = pyplot()
    rows = iteration_table(store, run_id)
    heads = dict(zip((k for k, _ in TABLE_COLUMNS), _headers(rows), strict=True)) if rows else {}
    heads["reward"] = "reward used"
    figures = {panel.stem: _panel_figure(plt, panel, rows, heads, run_id) for panel in PANELS}
    figures[RM_GAP] = _rm_gap_figure(plt, store, run_id)
    return figures


def write_report(
    store: RunStore, run_id: str, out_dir: Path, output: FigureOutput | None = None
) -> list[Path]:
    """report_figures in `output`'s formats (default PNG), then summary.md showing them."""
    output = output or FigureOutput()
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for stem, fig in report_figures(store, run_id).items():
        written += save_figure(plt, fig, out_dir, stem, output)
    summary = out_dir / "summary.md"
    pictures = picture_lines(written)
    summary.write_text(summary_markdown(store, run_id) + "\n" + "\n\n".join(pictures) + "\n")
    written.append(summary)
    return written


def report_with_inline_plots(store: RunStore, run_id: str, out_dir: Path) -> str:
    """write_report's summary with its plots inlined (inline_pngs)."""
    written = write_report(store, run_id, out_dir)
    return summary_markdown(store, run_id) + "\n" + inline_pngs(written) + "\n"


@dataclass(frozen=True)
class Panel:
    """One report plot: what it shows on which axis, and what it says when it has nothing."""

    stem: str
    title: str
    ylabel: str
    keys: tuple[str, ...]
    empty: str
    right_keys: tuple[str, ...] = ()
    right_label: str = ""
    right_empty: str = ""  # the right axis's label when none of its series has a value
    chance: float | None = None
    # x offset between series, so equal values' error bars stay apart
    dodge: float = 0.0


POLICY_LABEL = "policy (k = after k GRPO iterations)"
# An RM keeps its colour; its stale (k-1) models are dashed with open markers beside it.
SERIES_STYLES = {
    "orm_auroc": ("tab:blue", "-", True),
    "orm_auroc_stale": ("tab:blue", "--", False),
    "prm_step_auroc": ("tab:green", "-", True),
    "prm_step_auroc_stale": ("tab:green", "--", False),
    "orm_auroc_new_questions": ("tab:purple", "-.", True),
}
RM_GAP = "rm_vs_verifier"
PANELS = (
    Panel(
        "accuracy",
        "Accuracy on held-out problems",
        "accuracy (bars: ±1 s.e. over questions)",
        ("greedy_acc", "sample_acc", "maj", "pass"),
        "no evaluation yet",
        dodge=0.03,
    ),
    Panel(
        "reward_kl",
        "GRPO: reward paid vs verifier",
        "reward / accuracy, mean over the GRPO steps",
        ("reward", "rm_reward", "verifier_acc"),
        "no GRPO stage yet",
        right_keys=("kl",),
        right_label="KL to the reference (dashed)",
        right_empty="KL to the reference: - (the run applies none)",
    ),
    Panel(
        "rm_auroc",
        "RM drift: retrained vs stale",
        "AUROC on fresh outputs (bars: 95% CI)",
        (*DRIFT_METRICS, "orm_auroc_new_questions"),
        "no AUROC: no reward model, or outputs all right or all wrong",
        chance=0.5,
        dodge=0.03,
    ),
)


def _panel_figure(
    plt: Any, panel: Panel, rows: list[dict[str, Any]], heads: dict[str, str], run_id: str
) -> Any:
    """One per-policy panel: its series with their error bars, the legend outside."""
    fig, ax = new_figure(plt, 8, 4)
    plotted = _draw(ax, rows, panel.keys, heads, dodge=panel.dodge)
    handles = ax.get_legend_handles_labels()[0]
    if panel.right_keys:  # another quantity, another axis
        right = ax.twinx()
        right_drawn = _draw(right, rows, panel.right_keys, heads, style="--", color="tab:red")
        right.set_ylabel(panel.right_label if right_drawn else panel.right_empty)
        if not right_drawn:
            right.set_yticks([])
        plotted += right_drawn
        handles += right.get_legend_handles_labels()[0]
    if panel.chance is not None and plotted:
        handles.append(ax.axhline(panel.chance, color="grey", linestyle=":", label="chance"))
    if not plotted:
        ax.text(0.5, 0.5, panel.empty, ha="center", va="center", transform=ax.transAxes)
    keys = (*panel.keys, *panel.right_keys)
    shown = [r["policy"] for r in rows if any(r.get(k) is not None for k in keys)]
    policy_axis(ax, shown or [r["policy"] for r in rows], POLICY_LABEL)
    ax.set_ylabel(panel.ylabel)
    ax.set_title(f"{panel.title} — {run_id}")
    ax.grid(alpha=0.3)
    legend_outside(fig, handles)
    return fig


def _draw(
    ax: Any,
    rows: list[dict[str, Any]],
    keys: tuple[str, ...],
    heads: dict[str, str],
    style: str = "-",
    color: str | None = None,
    dodge: float = 0.0,
) -> int:
    """Plot each key's values per policy, with bars where known (its 95% interval, else ±1
    s.e.), series `dodge` apart around each policy; the number of lines drawn."""
    drawn = 0
    for i, key in enumerate(keys):
        points = [r for r in rows if r.get(key) is not None]
        if not points:
            continue
        ys = [r[key] for r in points]
        line_color, line_style, filled = SERIES_STYLES.get(key, (color, style, True))
        errors = interval_errors(ys, [r.get(f"{key}_ci") for r in points])
        if errors is None and any(r.get(f"{key}_se") for r in points):
            errors = [[r.get(f"{key}_se") or 0.0 for r in points]] * 2
        ax.errorbar(
            [r["policy"] + (i - (len(keys) - 1) / 2) * dodge for r in points],
            ys,
            yerr=errors,
            marker="o",
            linestyle=line_style,
            capsize=3,
            label=heads.get(key, key),
            color=line_color,
            markerfacecolor=None if filled else "white",
        )
        drawn += 1
    return drawn


def _rm_gap_figure(plt: Any, store: RunStore, run_id: str) -> Any:
    """Per GRPO step: the learned RMs' mean reward beside the verifier's accuracy on the same
    samples; a widening gap is the policy optimising the RM rather than the task."""
    table = store.read(
        "metrics",
        run_id=run_id,
        where="stage = 'grpo' AND name IN ('rm_reward_mean', 'verifier_accuracy')",
    )
    series: dict[str, dict[tuple[int, int], float]] = defaultdict(dict)
    for row in table.to_pylist():
        series[row["name"]][int(row["iteration"]), int(row["step"])] = float(row["value"])
    from matplotlib.ticker import MaxNLocator

    steps = sorted({at for values in series.values() for at in values})
    position = {at: i for i, at in enumerate(steps)}
    fig, ax = new_figure(plt, 8, 4)
    labels = {"rm_reward_mean": "RM reward", "verifier_accuracy": "verifier accuracy"}
    for name, values in sorted(series.items()):
        at = sorted(values)
        ax.plot([position[a] for a in at], [values[a] for a in at], label=labels[name])
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    if steps:
        # iteration k's GRPO stage (stored as k, from 0) makes policy k+1
        mark_iterations(ax, [it for it, _ in steps], lambda it: f"to policy {it + 1}")
        ax.set_xlim(-0.5, len(steps) - 0.5)
    else:
        ax.text(0.5, 0.5, "no GRPO stage yet", ha="center", va="center", transform=ax.transAxes)
    ax.set_xlabel("GRPO step (all iterations in order; dashed: a new iteration)")
    ax.set_ylabel("mean over the step's samples")
    ax.set_title(f"RM reward vs verifier per GRPO step — {run_id}")
    ax.grid(alpha=0.3)
    legend_outside(fig, ax.get_legend_handles_labels()[0])
    return fig
