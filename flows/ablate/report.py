"""An ablation's report: plots analogous to DeepSeekMath Figs. 5-7 and a markdown summary
(table, verdicts, plots) under <store>/reports/<ablation_id>/, and the same page with the plots
inlined for the Prefect artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from flows.ablate.cost import COST_NOTE, format_cost_table
from flows.ablate.results import (
    CLAIMS_NOTE,
    FIG5_LINKS,
    FIG6_LINKS,
    FIG7_ARM,
    Values,
    claims,
    format_results_table,
)
from flows.ablate.stats import Interval
from flows.eval_values import GREEDY, MAJ, PASS
from flows.figures import (
    FigureOutput,
    inline_pngs,
    legend_outside,
    new_figure,
    picture_lines,
    policy_axis,
    pyplot,
    save_figure,
)

FIG5_ARMS = ("sft", "rft", "online_rft", "grpo_os", "grpo_ps")


def _fig5_arms(values: Values) -> list[str]:
    wanted = [*FIG5_ARMS, *(a for link in FIG5_LINKS for a in (link[0], link[2]))]
    present = [a for a in dict.fromkeys(wanted) if a in values.arms()]
    return present or values.arms()


def _band(ax: Any, xs: list[float], cis: list[Interval], label: str, style: str = "-o") -> None:
    """Means with their 95% intervals as error bars (a single seed: the mean alone)."""
    errs = [c.half or 0.0 for c in cis]
    ax.errorbar(
        xs,
        [c.mean for c in cis],
        yerr=errs if any(errs) else None,
        fmt=style,
        capsize=3,
        label=label,
    )


def _per_iteration(
    ax: Any, values: Values, arms: list[str], metric: str, k: int, last: int | None
) -> list[int]:
    """Each arm's `metric` per policy (up to policy_`last`; None: all), mean and 95% CI;
    the policies drawn."""
    drawn: list[int] = []
    for i, arm in enumerate(arms):
        policies = [p for p in values.iterations(arm) if last is None or p <= last]
        points = [(p, values.interval(arm, p, metric, k)) for p in policies]
        shown = [(p, ci) for p, ci in points if ci is not None]
        if shown:  # arms side by side around each policy, so equal ones stay visible
            dodge = (i - (len(arms) - 1) / 2) * 0.03
            _band(ax, [p + dodge for p, _ in shown], [ci for _, ci in shown], arm)
            drawn += [p for p, _ in shown]
    return drawn


def write_plots(
    values: Values, ablation_id: str, out_dir: Path, output: FigureOutput | None = None
) -> list[Path]:
    """fig5_arms, fig6_rm_retraining, fig7_maj_pass (means and 95% intervals) in `output`'s
    formats (default PNG)."""
    output = output or FigureOutput()
    plt = pyplot()
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    k = values.top_k() or 1
    fig6_arms = [a for link in FIG6_LINKS for a in (link[0], link[2]) if a in values.arms()]
    for name, title, arms, last in (
        ("fig5_arms", "Fig. 5 analogue: equal samples and steps", _fig5_arms(values), 1),
        ("fig6_rm_retraining", "Fig. 6 analogue: RM retrained vs once", fig6_arms, None),
    ):
        fig, axes = new_figure(plt, 12, 4, ncols=2)
        handles: dict[str, Any] = {}
        for ax, metric, at, label in (
            (axes[0], GREEDY, 1, "greedy accuracy"),
            (axes[1], MAJ, k, f"Maj@{k}"),
        ):
            drawn = _per_iteration(ax, values, arms, metric, at, last)
            if not drawn:
                ax.text(0.5, 0.5, "not run (arms missing)", ha="center", transform=ax.transAxes)
            policy_axis(ax, drawn, "policy (k = after k iterations)")
            ax.set_ylim(-0.05, 1.05)  # accuracies; a t-interval may reach beyond
            ax.set_ylabel(f"{label} (95% CI over seeds)")
            ax.grid(alpha=0.3)
            for handle, arm in zip(*ax.get_legend_handles_labels(), strict=True):
                handles.setdefault(arm, handle)  # one entry per arm for both panels
        legend_outside(fig, list(handles.values()))
        fig.suptitle(f"{title} — {ablation_id}", fontsize="medium")
        paths += save_figure(plt, fig, out_dir, name, output)
    paths += save_figure(plt, _fig7(plt, values, ablation_id), out_dir, "fig7_maj_pass", output)
    return paths


def _fig7(plt: Any, values: Values, ablation_id: str) -> Any:
    fig, ax = new_figure(plt, 8, 4)
    arm = FIG7_ARM
    if arm in values.arms():
        final = values.final_iteration(arm)
        for metric, style in ((MAJ, "-o"), (PASS, "--s")):
            for policy in (0, final):
                ks = values.ks(metric)
                points = [(k, values.interval(arm, policy, metric, k)) for k in ks]
                shown = [(k, ci) for k, ci in points if ci is not None]
                label = f"{metric.replace('@k', '@K')}, policy_{policy}"
                _band(ax, [float(k) for k, _ in shown], [ci for _, ci in shown], label, style)
        ax.set_xscale("log", base=2)
        ax.set_xticks(values.ks(MAJ), labels=[str(k) for k in values.ks(MAJ)])  # K as numbers
        ax.set_ylim(-0.05, 1.05)
    else:
        ax.text(0.5, 0.5, f"not run (no arm {arm})", ha="center", transform=ax.transAxes)
    ax.set_xlabel("K (samples per problem)")
    ax.set_ylabel("accuracy (95% CI over seeds)")
    ax.set_title(f"Fig. 7 analogue: Maj@K and Pass@K, {arm} — {ablation_id}", fontsize="medium")
    ax.grid(alpha=0.3)
    legend_outside(fig, ax.get_legend_handles_labels()[0])
    return fig


def verdict_lines(values: Values) -> str:
    return "\n".join(claim.text() for claim in claims(values))


def _cost_lines(values: Values) -> list[str]:
    """The "cost per arm" section (none when the ablation's rows hold no cost)."""
    table = format_cost_table(values)
    return ["## Cost per arm", "", "```", table, "```", "", COST_NOTE, ""] if table else []


def summary_markdown(values: Values, ablation_id: str, description: str) -> str:
    """The report page without its pictures: description, table, cost, verdicts, how to
    query."""
    return "\n".join(
        [
            f"# itergrpo ablation `{ablation_id}`",
            "",
            description.strip(),
            "",
            "```",
            format_results_table(values),
            "```",
            "",
            *_cost_lines(values),
            "```",
            verdict_lines(values),
            "```",
            "",
            CLAIMS_NOTE,
            "",
            'Query: `itergrpo sql "SELECT arm, seed, policy_iteration, metric, k, value FROM '
            f"ablation WHERE ablation_id = '{ablation_id}'\"`",
            "",
        ]
    )


def write_ablation_report(
    values: Values,
    ablation_id: str,
    description: str,
    out_dir: Path,
    output: FigureOutput | None = None,
) -> list[Path]:
    """The plots and summary.md (pictures linked beside it)."""
    plots = write_plots(values, ablation_id, out_dir, output)
    pictures = "\n\n".join(picture_lines(plots))
    summary = out_dir / "summary.md"
    summary.write_text(summary_markdown(values, ablation_id, description) + "\n" + pictures + "\n")
    return [*plots, summary]


def report_with_inline_plots(
    values: Values, ablation_id: str, description: str, out_dir: Path
) -> str:
    """write_ablation_report's page with the plots inlined (a Prefect artifact cannot link
    to files in the store)."""
    written = write_ablation_report(values, ablation_id, description, out_dir)
    return summary_markdown(values, ablation_id, description) + "\n" + inline_pngs(written) + "\n"
