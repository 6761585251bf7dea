"""Report figures fit to publish: labelled axes, whole-number policy ticks, iteration
boundaries, legends off the data, AUROC intervals (old stores too), PNG / PDF / SVG at a DPI."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from flows.figures import FigureOutput, legend_outside, mark_iterations, policy_axis, pyplot
from flows.report import PANELS, RM_GAP, Z95, iteration_table, report_figures, write_report
from grpo_core.contracts.errors import SettingError
from storage.store import RunStore


def visible_ticks(ax: Any) -> list[float]:
    low, high = ax.get_xlim()
    return [t for t in ax.get_xticks() if low <= t <= high]


@pytest.mark.parametrize("policies", [[0], [1], [0, 1, 2, 3], list(range(40))])
def test_policy_ticks_are_whole_policies(policies: list[int]) -> None:
    plt = pyplot()
    fig, ax = plt.subplots()
    ax.plot(policies, [0.5] * len(policies))
    policy_axis(ax, policies, "policy")
    ticks = visible_ticks(ax)
    assert ticks and all(float(t).is_integer() for t in ticks)
    if len(policies) <= 4:
        assert ticks == policies  # one tick per policy, none between
    plt.close(fig)


def test_no_policy_gets_no_made_up_ticks() -> None:
    plt = pyplot()
    fig, ax = plt.subplots()
    policy_axis(ax, [], "policy")
    assert list(ax.get_xticks()) == [] and ax.get_xlabel() == "policy"
    plt.close(fig)


def test_iteration_boundaries_sit_between_the_iterations_steps() -> None:
    plt = pyplot()
    fig, ax = plt.subplots()
    mark_iterations(ax, [0, 0, 0, 1, 1, 2], lambda it: f"to policy {it + 1}")
    assert sorted(line.get_xdata()[0] for line in ax.get_lines()) == [2.5, 4.5]
    (top,) = ax.child_axes
    assert list(top.get_xticks()) == [1.0, 3.5, 5.0]  # the middle of each iteration's steps
    assert [t.get_text() for t in top.get_xticklabels()] == [
        "to policy 1",
        "to policy 2",
        "to policy 3",
    ]
    plt.close(fig)


def test_the_legend_sits_outside_the_axes() -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), layout="constrained")
    lines = [ax.plot([0, 1], [y, y], label=f"series {y}")[0] for y in range(6)]
    legend_outside(fig, lines)
    fig.canvas.draw()
    (legend,) = fig.legends
    assert not legend.get_window_extent().overlaps(ax.get_window_extent())
    plt.close(fig)


def test_unknown_formats_and_dpis_are_refused_naming_the_option() -> None:
    with pytest.raises(SettingError, match="--format must be one or more of png, pdf, svg"):
        FigureOutput(("jpg",))
    with pytest.raises(SettingError, match="--dpi must be between 10 and 1200"):
        FigureOutput(("png",), dpi=0)


def test_auroc_intervals_read_from_new_rows_and_from_stores_written_before_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Eval files without ci_low / ci_high (before bootstrap intervals) still read: their
    AUROCs get the normal 95% interval of their stored standard error, clipped to [0, 1]."""
    import pyarrow as pa

    from storage import schemas

    new = schemas.TABLE_SCHEMAS["eval"]
    old = pa.schema([f for f in new if f.name not in ("ci_low", "ci_high")])
    accuracy = {"split": "test", "metric": "greedy_accuracy", "k": None, "value": 0.5}
    store = RunStore(tmp_path)
    with store.open_run("r", {}) as run:
        monkeypatch.setitem(schemas.TABLE_SCHEMAS, "eval", old)
        with run.stage(0, "train_rm") as attempt:  # as an earlier version wrote it
            attempt.write(
                "eval",
                [
                    {"policy_iteration": 0, **accuracy, "stderr": 0.1, "n": 25},
                    {"policy_iteration": 0, "split": "train", "metric": "orm_auroc", "k": None}
                    | {"value": 0.9, "stderr": 0.07, "n": 256},
                ],
            )
        monkeypatch.setitem(schemas.TABLE_SCHEMAS, "eval", new)
        with run.stage(1, "train_rm") as attempt:
            attempt.write(
                "eval",
                [
                    {"policy_iteration": 1, **accuracy, "stderr": 0.1, "n": 25},
                    {"policy_iteration": 1, "split": "train", "metric": "orm_auroc", "k": None}
                    | {"value": 0.8, "stderr": 0.05, "n": 256, "ci_low": 0.7, "ci_high": 0.88},
                ],
            )
    rows = iteration_table(store, "r")
    assert rows[0]["orm_auroc_ci"] == pytest.approx((0.9 - Z95 * 0.07, 1.0))
    assert rows[1]["orm_auroc_ci"] == (0.7, 0.88)
    assert rows[0]["orm_auroc_new_questions_ci"] is None  # no such row: no interval


@pytest.mark.slow
def test_the_report_writes_each_format_at_its_dpi(
    micro_run: tuple[RunStore, str], tmp_path: Path
) -> None:
    import matplotlib.image as mpimg

    store, run_id = micro_run
    stems = [*(p.stem for p in PANELS), RM_GAP]
    written = write_report(store, run_id, tmp_path / "a", FigureOutput(("png", "pdf", "svg"), 50))
    assert [p.name for p in written] == [
        *(f"{stem}.{fmt}" for stem in stems for fmt in ("png", "pdf", "svg")),
        "summary.md",
    ]
    for path in written[:-1]:
        head = path.read_bytes()[:200]
        assert {".png": b"\x89PNG", ".pdf": b"%PDF", ".svg": b"<svg"}[path.suffix] in head
    # no dates, no random ids: the same store gives the same bytes
    again = write_report(store, run_id, tmp_path / "a2", FigureOutput(("png", "pdf", "svg"), 50))
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in written]
    # the same 8 x 4 inch figure, 50 and 100 dots per inch
    assert mpimg.imread(tmp_path / "a" / "accuracy.png").shape[:2] == (200, 400)
    write_report(store, run_id, tmp_path / "b", FigureOutput(("png",), 100))
    assert mpimg.imread(tmp_path / "b" / "accuracy.png").shape[:2] == (400, 800)
    page = (tmp_path / "a" / "summary.md").read_text()
    assert "![accuracy](accuracy.png)" in page and "[accuracy.pdf](accuracy.pdf)" in page
    (tmp_path / "c").mkdir()
    only_pdf = write_report(store, run_id, tmp_path / "c", FigureOutput(("pdf",)))
    assert {p.suffix for p in only_pdf} == {".pdf", ".md"}


def assert_publishable(fig: Any) -> None:
    """Every axis labelled, and the legend (if any) clear of every axes."""
    fig.canvas.draw()
    for ax in fig.axes:
        assert ax.get_ylabel(), ax.get_title()
        if ax.get_xlabel() == "":  # a twin shares its x axis with the axes it twins
            assert any(other.get_xlabel() for other in ax.get_shared_x_axes().get_siblings(ax))
    for legend in fig.legends:
        for ax in fig.axes:
            assert not legend.get_window_extent().overlaps(ax.get_window_extent())


@pytest.mark.slow
def test_a_one_iteration_report_has_whole_policy_ticks(tmp_path: Path) -> None:
    from flows.loop import execute_run
    from tests.flow_helpers import micro_config

    execute_run(micro_config(tmp_path, "one", "run.iterations=1"))
    figures = report_figures(RunStore(tmp_path), "one")
    # accuracy: policy_0 and policy_1; GRPO means: the stage that made policy_1; RM AUROC:
    # the RMs of iteration 0 on policy_0's outputs (a one-iteration run had ticks of
    # -0.045 ... 0.045 there before)
    expected = {"accuracy": [0, 1], "reward_kl": [1], "rm_auroc": [0]}
    for panel in PANELS:
        ax = figures[panel.stem].axes[0]
        assert visible_ticks(ax) == expected[panel.stem]
        assert_publishable(figures[panel.stem])
    gap = figures[RM_GAP]
    assert_publishable(gap)
    assert [line.get_label() for line in gap.axes[0].get_lines()] == [
        "RM reward",
        "verifier accuracy",
    ]  # one iteration: no boundary line
    (top,) = gap.axes[0].child_axes
    assert [t.get_text() for t in top.get_xticklabels()] == ["to policy 1"]


@pytest.mark.slow
def test_per_step_plots_mark_where_each_iteration_starts(micro_run: tuple[RunStore, str]) -> None:
    store, run_id = micro_run
    steps = store.read("metrics", run_id=run_id, where="stage = 'grpo' AND name = 'kl'")
    per_iteration = len([r for r in steps.to_pylist() if r["iteration"] == 0])
    gap = report_figures(store, run_id)[RM_GAP]
    ax = gap.axes[0]
    boundaries = [line.get_xdata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert boundaries == [per_iteration - 0.5]
    rm_auroc = iteration_table(store, run_id)
    for row in rm_auroc:
        if row["orm_auroc"] is not None:
            low, high = row["orm_auroc_ci"]
            assert low <= row["orm_auroc"] <= high and low < high
