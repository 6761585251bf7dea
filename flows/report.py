"""Run reports: the per-iteration table, a markdown summary and PNG plots, from the store."""

from __future__ import annotations

import base64
import shlex
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from flows.names import EVAL_SPLIT, TRAIN_SPLIT
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
    "verifier says of the same samples). Accuracies: test split."
)
DRIFT_METRICS = ("orm_auroc", "orm_auroc_stale", "prm_step_auroc", "prm_step_auroc_stale")


def _eval_by_policy(store: RunStore, run_id: str) -> dict[str, dict[int, dict[str, float]]]:
    """Eval values per split and policy: `metric` for K-free metrics, `pass@4` style names
    for per-K ones, and `<name>_se` for their standard errors."""
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
    return out


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
                "greedy_acc": metrics.get("greedy_accuracy"),
                "greedy_acc_se": metrics.get("greedy_accuracy_se"),
                "sample_acc": metrics.get("sampled_accuracy"),
                "maj": maj[1] if maj else None,
                "maj_se": metrics.get(f"maj@{maj[0]}_se") if maj else None,
                "maj_k": maj[0] if maj else None,
                "pass": pas[1] if pas else None,
                "pass_k": pas[0] if pas else None,
                **{name: drift.get(name) for name in DRIFT_METRICS},
                "orm_auroc_new_questions": metrics.get("orm_auroc"),
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
            "",
            TABLE_NOTE,
        ]
    else:
        text.append("No evaluation rows yet.")
    text += [
        "",
        f"Inspect with SQL: `{sql_hint(store, run_id)}`",
    ]
    return "\n".join(text) + "\n"


def sql_hint(store: RunStore, run_id: str) -> str:
    """A command that queries this run, pasteable from any shell (the store named)."""
    query = f"SELECT * FROM eval WHERE run_id = '{run_id}'"
    # Run ids are [A-Za-z0-9._-]: the query is safe inside double quotes.
    return f'itergrpo sql "{query}" --store {shlex.quote(str(store.root))}'


def write_report(store: RunStore, run_id: str, out_dir: Path) -> list[Path]:
    """PNG plots (accuracy / Maj@K / Pass@K / reward / KL / RM AUROC per policy) + summary.md."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    out_dir.mkdir(parents=True, exist_ok=True)
    rows = iteration_table(store, run_id)
    written = []
    heads = dict(zip((k for k, _ in TABLE_COLUMNS), _headers(rows), strict=True)) if rows else {}
    heads["reward"] = "reward used"
    for panel in PANELS:
        fig, ax = plt.subplots(figsize=(6.5, 4))
        plotted = _draw(ax, rows, panel.keys, heads)
        if panel.right_keys:  # another quantity, another axis
            right = ax.twinx()
            plotted += _draw(right, rows, panel.right_keys, heads, style="--", color="tab:red")
            right.set_ylabel(panel.right_label)
            lines = ax.get_legend_handles_labels()[0] + right.get_legend_handles_labels()[0]
        else:
            lines = ax.get_legend_handles_labels()[0]
        if panel.chance is not None:
            ax.axhline(panel.chance, color="grey", linestyle=":", label="chance")
            lines = ax.get_legend_handles_labels()[0]
        if not plotted:
            ax.text(0.5, 0.5, panel.empty, ha="center", va="center", transform=ax.transAxes)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # policies are whole numbers
        ax.set_xlabel("policy (k = after k GRPO iterations)")
        ax.set_ylabel(panel.ylabel)
        ax.set_title(f"{panel.title} — {run_id}")
        ax.grid(alpha=0.3)
        if lines:
            ax.legend(handles=lines, fontsize="small")
        written.append(save_figure(plt, fig, out_dir / panel.filename))
    written.append(_plot_rm_gap(plt, store, run_id, out_dir))
    summary = out_dir / "summary.md"
    pictures = [f"![{p.stem}]({p.name})" for p in written]
    summary.write_text(summary_markdown(store, run_id) + "\n" + "\n\n".join(pictures) + "\n")
    written.append(summary)
    return written


def save_figure(plt: Any, fig: Any, path: Path) -> Path:
    """Lay out, write (PNG, 100 dpi) and close a matplotlib figure."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def inline_pngs(paths: list[Path]) -> str:
    """Markdown pictures of the PNGs among `paths` as data: URIs (a Prefect markdown artifact
    lives in Prefect's database and cannot reach files in the store)."""
    return "\n\n".join(
        f"![{p.stem}](data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()})"
        for p in paths
        if p.suffix == ".png"
    )


def report_with_inline_plots(store: RunStore, run_id: str, out_dir: Path) -> str:
    """write_report's summary with its plots inlined (inline_pngs)."""
    written = write_report(store, run_id, out_dir)
    return summary_markdown(store, run_id) + "\n" + inline_pngs(written) + "\n"


@dataclass(frozen=True)
class Panel:
    """One report plot: what it shows on which axis, and what it says when it has nothing."""

    filename: str
    title: str
    ylabel: str
    keys: tuple[str, ...]
    empty: str
    right_keys: tuple[str, ...] = ()
    right_label: str = ""
    chance: float | None = None


PANELS = (
    Panel(
        "accuracy.png",
        "Accuracy on held-out problems",
        "accuracy (error bars: ±1 s.e.)",
        ("greedy_acc", "sample_acc", "maj", "pass"),
        "no evaluation yet",
    ),
    Panel(
        "reward_kl.png",
        "GRPO: reward paid vs verifier",
        "mean over the GRPO steps",
        ("reward", "rm_reward", "verifier_acc"),
        "no GRPO stage yet",
        right_keys=("kl",),
        right_label="KL to the reference (dashed)",
    ),
    Panel(
        "rm_auroc.png",
        "RM drift: retrained vs stale",
        "AUROC on fresh held-out outputs",
        (*DRIFT_METRICS, "orm_auroc_new_questions"),
        "no AUROC: no reward model, or outputs all right or all wrong",
        chance=0.5,
    ),
)


def _draw(
    ax: Any,
    rows: list[dict[str, Any]],
    keys: tuple[str, ...],
    heads: dict[str, str],
    style: str = "-",
    color: str | None = None,
) -> int:
    """Plot each key's values per policy (with ±1 s.e. bars where known); lines drawn."""
    drawn = 0
    for key in keys:
        points = [r for r in rows if r.get(key) is not None]
        if not points:
            continue
        xs = [r["policy"] for r in points]
        ys = [r[key] for r in points]
        errs = [r.get(f"{key}_se") or 0.0 for r in points]
        label = heads.get(key, key)
        ax.errorbar(
            xs,
            ys,
            yerr=errs if any(errs) else None,
            marker="o",
            linestyle=style,
            capsize=3,
            label=label,
            color=color,
        )
        drawn += 1
    return drawn


def _plot_rm_gap(plt: Any, store: RunStore, run_id: str, out_dir: Path) -> Path:
    """Per GRPO step: the learned RMs' mean reward beside the verifier's accuracy on the same
    samples; a widening gap is the policy optimising the RM rather than the task."""
    table = store.read(
        "metrics",
        run_id=run_id,
        where="stage = 'grpo' AND name IN ('rm_reward_mean', 'verifier_accuracy')",
    )
    series: dict[str, list[tuple[int, int, float]]] = defaultdict(list)
    for row in table.to_pylist():
        series[row["name"]].append((int(row["iteration"]), int(row["step"]), float(row["value"])))
    fig, ax = plt.subplots(figsize=(7, 4))
    labels = {"rm_reward_mean": "RM reward", "verifier_accuracy": "verifier accuracy"}
    for name, points in sorted(series.items()):
        points.sort()
        ax.plot(range(len(points)), [v for _, _, v in points], label=labels[name])
    ax.set_xlabel("GRPO step (all iterations in order)")
    ax.set_title(f"RM reward vs verifier per GRPO step — {run_id}")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend()
    return save_figure(plt, fig, out_dir / "rm_vs_verifier.png")
