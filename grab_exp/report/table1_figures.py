"""Table 1's Figure 1 (train loss and test accuracy per epoch) and Figure 2 (time and memory
bars), one color, line style and marker per row (:func:`grab_exp.report.table1_table.color_of`)."""

from __future__ import annotations

import math

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from grab_exp.report.render import COLUMN_WIDTH_IN, STYLE, log_axis
from grab_exp.report.table1_table import (
    BASELINE,
    Table1,
    color_of,
    line_style,
    row_label,
    row_rank,
)

_PANELS = (("train/loss", "Train loss"), ("test/acc", "Test accuracy"))
_MEMORY_AXIS = {
    "state": "Training state, allocated (MB)",
    "cuda_step": "Step peak CUDA memory (MB)",
    "cuda": "Peak CUDA memory (MB)",
    "rss": "Peak RSS (MB)",
    "mixed": "Peak memory (MB)",
}


def epoch_curves(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Mean and std over seeds of ``metric`` per variant, pipeline and epoch."""
    grouped = frame.groupby(["variant", "pipeline", "epoch"])[metric]
    return grouped.agg(["mean", "std"]).reset_index()


def zoom_span(last_epoch: int) -> int:
    """Epochs shown in the zoom panels: 10 of 100, about half of a short run (at least 2)."""
    return max(2, min(10, math.ceil(last_epoch / 2)))


def identical_rows(frame: pd.DataFrame, rows) -> dict[tuple[str, str], tuple[str, str]]:
    """Row -> an earlier row whose every run (seed) has exactly the same metrics in ``frame``."""
    metrics = [metric for metric, _ in _PANELS]
    curves = {}
    for row in rows:
        part = frame[(frame["variant"] == row[0]) & (frame["pipeline"] == row[1])]
        curves[row] = part.sort_values(["seed", "epoch"])[["seed", "epoch", *metrics]].to_numpy()
    same = {}
    for i, row in enumerate(rows):
        for earlier in rows[:i]:
            if earlier not in same and np.array_equal(curves[row], curves[earlier]):
                same[row] = earlier
                break
    return same


def figure1(frame: pd.DataFrame, log_loss: bool = False, zoom_epochs: int | None = None):
    """Train loss and test accuracy against epoch; top: all epochs, bottom: the first ones.

    Lines are the mean over seeds, each row with its own color, line style and marker; the top
    panels shade ± 1 std over seeds. A row whose runs equal an earlier row's exactly is named
    so in the legend. Accuracy is a fraction, as in the tables.

    Args:
        frame: The tidy run frame.
        log_loss: Log-scale y axis for the loss.
        zoom_epochs: Epochs in the zoom panels (default :func:`zoom_span`).

    Returns:
        The matplotlib Figure.
    """
    last = int(frame["epoch"].max())
    zoom = zoom_epochs or zoom_span(last)
    pairs = set(zip(frame["variant"], frame["pipeline"], strict=True))
    rows = sorted(pairs, key=lambda row: row_rank(*row))  # the report's order
    same = identical_rows(frame, rows)
    seeds = sorted(frame.groupby(["variant", "pipeline"])["seed"].nunique().unique())
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(COLUMN_WIDTH_IN, 3.9), layout="constrained")
        axes = fig.subplots(2, 2)
        for column, (metric, title) in enumerate(_PANELS):
            curves = epoch_curves(frame, metric)
            for row, limit in enumerate((last, zoom)):
                ax = axes[row, column]
                _draw_curves(ax, curves[curves["epoch"] <= limit], rows, same, band=row == 0)
                _epoch_axis(ax, limit)
                ax.set_title(title if row == 0 else f"{title}: first {limit} epochs")
                if metric == "train/loss" and log_loss:
                    log_axis(ax)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        n_seeds = "/".join(map(str, seeds))
        handles.append(Patch(color="#999999", alpha=0.3, linewidth=0))
        labels.append(f"± 1 std over {n_seeds} seeds (top panels)")
        fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False)
    return fig


def _epoch_axis(ax, limit: int) -> None:
    """x axis from epoch 1 to ``limit``, a tick at every epoch up to 10, else about 6."""
    pad = 0.04 * max(limit - 1, 1)  # end markers stay whole
    ax.set_xlim(1 - pad if limit > 1 else 0.5, max(limit + pad, 1.5))
    ax.set_xlabel("Epoch")
    ax.grid(alpha=0.25, linewidth=0.4)
    if limit <= 10:
        ax.set_xticks(range(1, limit + 1))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(6, integer=True))


def _draw_curves(ax, curves: pd.DataFrame, rows, same, band: bool) -> None:
    for variant, pipeline in rows:
        part = curves[(curves["variant"] == variant) & (curves["pipeline"] == pipeline)]
        if part.empty:
            continue
        x, mean, std = part["epoch"], part["mean"], part["std"].fillna(0)
        color = color_of(variant, pipeline)
        label = row_label(variant, pipeline)
        if (variant, pipeline) in same:
            label += f": identical to {row_label(*same[variant, pipeline])}"
        style, marker = line_style(variant, pipeline)
        every = max(1, len(part) // 10)
        size = 5 if (variant, pipeline) in same.values() else 3  # visible around its twin's
        ax.plot(x, mean, linestyle=style, color=color, label=label, marker=marker, ms=size,
                markevery=every, mfc="none", mew=0.7)  # fmt: skip
        if band:
            ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.08, linewidth=0)


def figure2(table: Table1):
    """Horizontal bars of seconds per epoch and peak memory per row, with overheads.

    With an idle-machine benchmark (``table.time_source``) the time panel shows its seconds per
    epoch and each row's time overhead in % relative to RR (functional), marked ``ref.``;
    without one it shows the jobs' own times (± std over seeds) and no overhead.
    """
    data = table.data.iloc[::-1].reset_index(drop=True)  # first row on top
    colors = [color_of(v, p) for v, p in zip(data["variant"], data["pipeline"], strict=True)]
    if table.time_source:
        column, overhead, where = "bench_epoch_s", "time_overhead_pct", "idle bench"
    else:
        column, overhead, where = "time_s_per_epoch", None, "during the runs"
    panels = (
        (column, overhead, f"Training time (s / epoch),\n{where}"),
        (table.memory_metric, "mem_overhead_pct", _memory_title(table)),
    )
    with mpl.rc_context(STYLE):
        height = 1.2 + 0.22 * len(data)
        fig = Figure(figsize=(COLUMN_WIDTH_IN, height), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        for ax, (metric, overhead, title) in zip(axes, panels, strict=True):
            _draw_bars(ax, data, metric, overhead, colors)
            ax.set_xlabel(title)
        axes[0].set_yticks(range(len(data)), data["label"])
        fig.suptitle(figure2_caption(table), fontsize=6)
    return fig


def _memory_title(table: Table1) -> str:
    where = "state bench" if table.memory_source == "state" else "runs"
    return f"{_MEMORY_AXIS[table.memory_source]},\n{where}"


def figure2_caption(table: Table1) -> str:
    """Where Figure 2's numbers come from."""
    if table.time_source:
        source = table.cite_time_source("\n")
        time = f"time: idle-machine benchmark {source},\noverheads vs. RR (functional)"
    else:
        time = "time: measured during the runs (machine load included), no overheads"
    if table.memory_source == "state":
        return f"{time};\nmemory: {table.memory_file}, overheads vs. RR (functional)"
    return f"{time};\nmemory: the runs ({', '.join(table.devices)}), mean ± std over seeds"


def _draw_bars(ax, data: pd.DataFrame, metric: str, overhead: str | None, colors) -> None:
    column = metric if metric in data else f"{metric}_mean"
    means = data[column]
    stds = data[f"{metric}_std"].fillna(0) if f"{metric}_std" in data else means * 0
    positions = range(len(data))
    errors = {"lw": 0.6, "ecolor": "#555555", "capsize": 1.5, "capthick": 0.6}
    ax.barh(positions, means, xerr=stds, color=colors, height=0.7, error_kw=errors)
    right = float((means + stds).max())
    for y, (mean, std, variant, pipeline) in enumerate(
        zip(means, stds, data["variant"], data["pipeline"], strict=True)
    ):
        if overhead is None or math.isnan(mean):
            continue
        pct = data[overhead].iloc[y]
        text = "ref." if (variant, pipeline) == BASELINE else overhead_label(pct)
        if text == "ref." or not math.isnan(pct):
            ax.text(mean + std + 0.02 * right, y, text, va="center", fontsize=5.5)
    ax.set_xlim(0, right * 1.3 if right > 0 else 1)
    ax.grid(axis="x", alpha=0.25, linewidth=0.4)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)


def overhead_label(pct: float) -> str:
    """``+12%``, ``-35%``, or ``±0%`` for overheads under half a percent."""
    return "±0%" if abs(pct) < 0.5 else f"{pct:+.0f}%"
