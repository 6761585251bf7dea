"""What every report figure shares: file formats and resolution, legends outside the axes,
whole-number policy ticks, iteration boundaries on per-step axes, interval error bars."""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from grpo_core.contracts.errors import SettingError

# PNG for pages and the Prefect artifact; PDF and SVG are vector (papers, slides).
FIGURE_FORMATS = ("png", "pdf", "svg")
DEFAULT_DPI = 100


@dataclass(frozen=True)
class FigureOutput:
    """Which files a figure is written as: one per format, raster ones at `dpi`."""

    formats: tuple[str, ...] = ("png",)
    dpi: int = DEFAULT_DPI

    def __post_init__(self) -> None:
        unknown = [f for f in self.formats if f not in FIGURE_FORMATS]
        if unknown or not self.formats:
            raise SettingError(
                f"--format must be one or more of {', '.join(FIGURE_FORMATS)} "
                f"(got {', '.join(self.formats) or 'none'})"
            )
        if not 10 <= self.dpi <= 1200:
            raise SettingError(f"--dpi must be between 10 and 1200 (got {self.dpi})")


def pyplot() -> Any:
    """matplotlib.pyplot on the file-only Agg backend (reports run without a display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams["svg.fonttype"] = "none"  # SVG text stays text, editable and searchable
    plt.rcParams["svg.hashsalt"] = "itergrpo"  # SVG element ids the same on every write
    return plt


def new_figure(plt: Any, width: float, height: float, ncols: int = 1) -> tuple[Any, Any]:
    """A figure whose layout makes room for labels and a legend outside the axes."""
    return plt.subplots(1, ncols, figsize=(width, height), layout="constrained")


def legend_outside(fig: Any, handles: Sequence[Any]) -> None:
    """The figure's legend to the right of its axes, where it cannot cover data."""
    if handles:
        fig.legend(handles=list(handles), loc="outside right upper", fontsize="small")


def policy_axis(ax: Any, policies: Sequence[int], label: str) -> None:
    """An x axis of policies: whole-number ticks, half a step of margin either side.

    A tick per policy up to MAX_POLICY_TICKS of them (a locator's "integer" mode gives up on
    spans under one and ticks a single policy at -0.045 ... 0.045), then whole-number ones.
    """
    from matplotlib.ticker import MaxNLocator

    if policies:
        low, high = min(policies), max(policies)
        ax.set_xlim(low - 0.5, high + 0.5)
        if high - low < MAX_POLICY_TICKS:
            ax.set_xticks(range(low, high + 1))
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    else:
        ax.set_xticks([])  # no policy yet: no made-up ones
    ax.set_xlabel(label)


MAX_POLICY_TICKS = 16


def mark_iterations(ax: Any, iterations: Sequence[int], name: Callable[[int], str]) -> None:
    """Dashed lines where the iteration changes along a per-step x axis (x = position in
    `iterations`), each span named (`name(iteration)`) on a second x axis above the plot."""
    starts = [i for i, it in enumerate(iterations) if i == 0 or it != iterations[i - 1]]
    ends = [*starts[1:], len(iterations)]
    for start in starts[1:]:
        ax.axvline(start - 0.5, color="grey", linestyle="--", linewidth=0.8)
    top = ax.secondary_xaxis("top")
    top.set_xticks(
        [(a + b - 1) / 2 for a, b in zip(starts, ends, strict=True)],
        labels=[name(iterations[a]) for a in starts],
    )
    top.tick_params(length=0, labelsize="small")


def interval_errors(
    values: Sequence[float], intervals: Sequence[tuple[float, float] | None]
) -> list[list[float]] | None:
    """Matplotlib's asymmetric yerr (2, n) for intervals around values; None without any."""
    if not any(intervals):
        return None
    below = [v - iv[0] if iv else 0.0 for v, iv in zip(values, intervals, strict=True)]
    above = [iv[1] - v if iv else 0.0 for v, iv in zip(values, intervals, strict=True)]
    return [below, above]


def save_figure(plt: Any, fig: Any, out_dir: Path, stem: str, output: FigureOutput) -> list[Path]:
    """Write `fig` as <stem>.<format> for each requested format, then close it."""
    paths = []
    for fmt in output.formats:
        path = out_dir / f"{stem}.{fmt}"
        fig.savefig(path, dpi=output.dpi, format=fmt, metadata=_NO_DATE.get(fmt))
        paths.append(path)
    plt.close(fig)
    return paths


# Vector files without a creation date: the same store gives byte-identical files.
_NO_DATE: dict[str, dict[str, Any]] = {"pdf": {"CreationDate": None}, "svg": {"Date": None}}


def picture_lines(paths: Sequence[Path]) -> list[str]:
    """Markdown for the written figures: the PNGs shown, the vector files linked on one line."""
    shown = [f"![{p.stem}]({p.name})" for p in paths if p.suffix == ".png"]
    vector = [f"[{p.name}]({p.name})" for p in paths if p.suffix in (".pdf", ".svg")]
    return [*shown, *(["Vector files: " + ", ".join(vector)] if vector else [])]


def inline_pngs(paths: Sequence[Path]) -> str:
    """Markdown pictures of the PNGs among `paths` as data: URIs (a Prefect markdown artifact
    lives in Prefect's database and cannot reach files in the store)."""
    return "\n\n".join(
        f"![{p.stem}](data:image/png;base64,{base64.b64encode(p.read_bytes()).decode()})"
        for p in paths
        if p.suffix == ".png"
    )
