"""Table 1's Figure 1 (train loss and test accuracy per epoch) and Figure 2 (time and memory
bars), one color, line style and marker per row (:func:`grab_exp.report.table1_rows.color_of`),
and their captions (``figures.md``)."""

from __future__ import annotations

import math

import matplotlib as mpl
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from grab_exp.report.render import COLUMN_WIDTH_IN, STYLE, log_axis
from grab_exp.report.table1_rows import BASELINE, color_of, line_style, row_label, row_rank
from grab_exp.report.table1_stats import WINDOW
from grab_exp.report.table1_table import Table1
from grab_exp.report.table1_text import MB_NOTE, MEMORY_NOTES, SE_NOTE, increment

_PANELS = (("train/loss", "Train loss"), ("test/acc", "Test accuracy"))
#: Figure 2's title words for its memory panel, by memory source
_MEMORY_WORDS = {
    "state": "training-state memory",
    "cuda_step": "step-peak CUDA memory",
    "cuda": "peak CUDA memory",
    "rss": "peak RSS",
    "mixed": "peak memory",
}
_MEMORY_AXIS = {
    "state": "Training state (MB):\nmodel, grads, momentum,\nordering, step peak",
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


def panel_spans(last: int, zoom: int) -> list[tuple[int, int]]:
    """Figure 1's rows of panels as ``(first, last)`` epochs: all of them, the first ``zoom``
    where that is fewer than all, and, for runs of at least twice :data:`WINDOW` epochs, the
    last :data:`WINDOW` (the window of the paired tests)."""
    spans = [(1, last)] + ([(1, zoom)] if zoom < last else [])
    return spans + ([(last - WINDOW + 1, last)] if last >= 2 * WINDOW else [])


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
    """Train loss and test accuracy against epoch: all epochs, the first ones and (long runs)
    the last :data:`WINDOW`.

    Lines are the mean over seeds, each row with its own color, line style and marker; every
    panel shades ± 1 std over seeds. A row whose runs equal an earlier row's exactly is named
    so in the legend. Accuracy is a fraction, as in the tables; :func:`figure1_caption` is
    the caption.

    Args:
        frame: The tidy run frame.
        log_loss: Log-scale y axis for the loss.
        zoom_epochs: Epochs in the zoom panels (default :func:`zoom_span`).

    Returns:
        The matplotlib Figure.
    """
    last = int(frame["epoch"].max())
    spans = panel_spans(last, zoom_epochs or zoom_span(last))
    rows = figure_rows(frame)
    same = identical_rows(frame, rows)
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(COLUMN_WIDTH_IN, 1.2 + 1.35 * len(spans)), layout="constrained")
        axes = fig.subplots(len(spans), 2, squeeze=False)
        for column, (metric, title) in enumerate(_PANELS):
            curves = epoch_curves(frame, metric)
            for row, (first, end) in enumerate(spans):
                ax = axes[row, column]
                shown = curves[(curves["epoch"] >= first) & (curves["epoch"] <= end)]
                _draw_curves(ax, shown, rows, same)
                _epoch_axis(ax, first, end)
                ax.set_title(f"{title}, {_span_words(first, end, last)}")
                if metric == "train/loss" and log_loss:
                    log_axis(ax)
        handles, labels = axes[0, 0].get_legend_handles_labels()
        handles.append(Patch(color="#999999", alpha=0.3, linewidth=0))
        labels.append(f"± 1 std over {seed_counts(frame)} seeds")
        fig.legend(handles, labels, loc="outside lower center", ncol=2, frameon=False)
    return fig


def figure_rows(frame: pd.DataFrame) -> list[tuple[str, str]]:
    """The frame's rows in the report's order."""
    pairs = set(zip(frame["variant"], frame["pipeline"], strict=True))
    return sorted(pairs, key=lambda row: row_rank(*row))


def seed_counts(frame: pd.DataFrame) -> str:
    """The rows' seed counts, e.g. ``3`` or ``2/3``."""
    counts = frame.groupby(["variant", "pipeline"])["seed"].nunique().unique()
    return "/".join(map(str, sorted(counts)))


def _span_words(first: int, end: int, last: int) -> str:
    if first == 1 and end == last:
        return "all epochs"
    return f"first {end} epochs" if first == 1 else f"last {end - first + 1} epochs"


def _epoch_axis(ax, first: int, end: int) -> None:
    """x axis from ``first`` to ``end`` (no epoch without data), a tick at ``first`` and at
    every epoch up to 10 of them, else about 6 (round ones after ``first``)."""
    ax.set_xlim(first - 0.5, first + 0.5) if end == first else ax.set_xlim(first, end)
    ax.set_xlabel("Epoch")
    ax.grid(alpha=0.25, linewidth=0.4)
    if end - first < 10:
        ax.set_xticks(range(first, end + 1, 1 if end - first < 6 else 2))
    else:
        ticks = MaxNLocator(6, integer=True).tick_values(first, end)
        step = ticks[1] - ticks[0]
        ax.set_xticks([first, *(t for t in ticks if first + step / 2 < t <= end)])


def _draw_curves(ax, curves: pd.DataFrame, rows, same) -> None:
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
                markevery=every, mfc="none", mew=0.7, clip_on=False)  # fmt: skip  # whole ends
        ax.fill_between(x, mean - std, mean + std, color=color, alpha=0.15, linewidth=0)


def overlapping_rows(frame: pd.DataFrame) -> list[tuple[str, str, float, float]]:
    """Rows of one variant (e.g. the two RR rows) whose seed-mean curves lie on each other:
    ``(label, other label, largest train-loss gap, largest test-accuracy gap)``."""
    rows, out = figure_rows(frame), []
    curves = {metric: epoch_curves(frame, metric) for metric, _ in _PANELS}
    for a, b in ((a, b) for i, a in enumerate(rows) for b in rows[i + 1 :] if a[0] == b[0]):
        gaps = []
        for metric, _ in _PANELS:
            wide = curves[metric].pivot_table(
                index="epoch", columns=["variant", "pipeline"], values="mean"
            )
            gaps.append(float((wide[a] - wide[b]).abs().max()))
        out.append((row_label(*a), row_label(*b), *gaps))
    return out


def figure1_caption(frame: pd.DataFrame) -> str:
    """Figure 1's caption: its lines, bands and panels, and the rows drawn on each other."""
    last = int(frame["epoch"].max())
    spans = panel_spans(last, zoom_span(last))
    words = ", ".join(_span_words(first, end, last) for first, end in spans)
    text = (
        "**Figure 1.** Train loss (full pass over the training set after each epoch) and test "
        "accuracy (a fraction) per epoch, Table 1's rows; lines: the mean over "
        f"{seed_counts(frame)} seeds, shaded: ± 1 sample std (ddof 1) over the seeds. Panels, "
        f"top to bottom: {words}."
    )
    same = identical_rows(frame, figure_rows(frame))
    for row, earlier in same.items():
        text += f" {row_label(*row)} is identical to {row_label(*earlier)} at every epoch and seed."
    for a, b, loss, acc in overlapping_rows(frame):
        if not any(label in (row_label(*r) for r in same) for label in (a, b)):
            text += (
                f" {a} and {b} are drawn close together ({a} partly hidden under {b}): "
                f"their means differ by at most {loss:.4f} in "
                f"train loss and {acc:.4f} in test accuracy."
            )
    return text


def figure2(table: Table1):
    """Horizontal bars of seconds per epoch and memory per row, each labelled with its overhead.

    With an idle-machine benchmark (``table.time_source``) the time panel shows its seconds per
    epoch, one measurement per row (no error bar), and each row's time overhead relative to RR
    (functional), marked ``ref.``; without one it shows the jobs' own times (± std over seeds)
    and no overhead. The memory panel labels each bar with its increment in MB and in %.
    :func:`figure2_caption` says where the numbers come from.
    """
    data = table.data.iloc[::-1].reset_index(drop=True)  # first row on top
    colors = [color_of(v, p) for v, p in zip(data["variant"], data["pipeline"], strict=True)]
    if table.time_source:
        time = ("bench_epoch_s", "time_overhead_pct", "Time (s / epoch),\nidle bench")
    else:
        time = ("time_s_per_epoch", None, "Time (s / epoch),\nduring the runs")
    panels = (time, (table.memory_metric, "mem_overhead_pct", _MEMORY_AXIS[table.memory_source]))
    with mpl.rc_context(STYLE):
        height = 1.3 + 0.22 * len(data)
        fig = Figure(figsize=(COLUMN_WIDTH_IN, height), layout="constrained")
        axes = fig.subplots(1, 2, sharey=True)
        for ax, (metric, overhead, title) in zip(axes, panels, strict=True):
            _draw_bars(ax, data, metric, overhead, colors)
            ax.set_xlabel(title, fontsize=6)
        axes[0].set_yticks(range(len(data)), data["label"])
        fig.suptitle(figure2_title(table), fontsize=6)
    return fig


def figure2_title(table: Table1) -> str:
    """Figure 2's title: what its panels show, then where each panel's numbers come from (file,
    commit, threads, processor)."""
    memory = _MEMORY_WORDS[table.memory_source]
    time = f"time: {table.cite_time_source()}" if table.time_source else "time: the runs' own"
    where = f"memory: {table.memory_file} ({table.memory_machine})" if table.memory_file else (
        "memory: the runs' own"
    )  # fmt: skip
    return f"Training time and {memory}; labels: overhead over RR (functional)\n{time}\n{where}"


def figure2_caption(table: Table1) -> str:
    """Figure 2's caption: where its numbers come from and what they measure."""
    if table.time_source:
        time = (
            f"Time: the idle-machine benchmark {table.cite_time_source()}, seconds per epoch "
            "(median step time x steps per epoch), one measurement per row."
        )
    else:
        time = (
            "Time: as the runs measured it (machine load included), mean ± std over seeds; "
            "no overheads."
        )
    if table.memory_source == "state":
        memory = MEMORY_NOTES["state"].format(file=table.memory_file, machine=table.memory_machine)
    else:
        devices = ", ".join(table.devices)
        memory = f"{MEMORY_NOTES[table.memory_source]} ({devices}), mean ± std over seeds"
    return (
        "**Figure 2.** Training time per epoch and memory of Table 1's rows; the label beside "
        "each bar is its overhead over RR (functional) (ref.), memory's in MB and in %. "
        f"{time} Memory: {memory}; {MB_NOTE}"
        + (f"; {SE_NOTE}." if table.data["mem_increment_se_mb"].notna().any() else ".")
    )


def _draw_bars(ax, data: pd.DataFrame, metric: str, overhead: str | None, colors) -> None:
    column = metric if metric in data else f"{metric}_mean"
    means = data[column]
    stds = data.get(f"{metric}_std", means * float("nan"))
    varies = bool(stds.notna().any())  # an error bar only where seeds spread the value
    errors = {"lw": 0.6, "ecolor": "#555555", "capsize": 1.5, "capthick": 0.6}
    ax.barh(range(len(data)), means, xerr=stds.fillna(0) if varies else None, color=colors,
            height=0.7, error_kw=errors)  # fmt: skip
    ends = means + (stds.fillna(0) if varies else 0)
    right = float(ends.max())
    for y, (end, variant, pipeline) in enumerate(
        zip(ends, data["variant"], data["pipeline"], strict=True)
    ):
        text = _bar_label(data, y, overhead, (variant, pipeline))
        if text and not math.isnan(end):
            ax.text(end + 0.02 * right, y, text, va="center", fontsize=5.5)
    ax.set_xlim(0, right * (1.75 if overhead == "mem_overhead_pct" else 1.35) if right > 0 else 1)
    ax.xaxis.set_major_locator(MaxNLocator(5))
    ax.grid(axis="x", alpha=0.25, linewidth=0.4)
    ax.set_axisbelow(True)
    ax.tick_params(axis="y", length=0)


def _bar_label(data: pd.DataFrame, y: int, overhead: str | None, row) -> str:
    """``ref.`` on the baseline, else the overhead (memory: ``+0.71 MB, +21%``); ``""`` for none."""
    if overhead is None:
        return ""
    if row == BASELINE:
        return "ref."
    pct = data[overhead].iloc[y]
    if math.isnan(pct):
        return ""
    if overhead == "mem_overhead_pct":
        mb, se = data["mem_increment_mb"].iloc[y], data["mem_increment_se_mb"].iloc[y]
        return f"{increment(mb, se)}, {overhead_label(pct)}"
    return overhead_label(pct)


def overhead_label(pct: float) -> str:
    """The overhead as measured, with its sign: ``+12%``, ``-35%``; under 1% in magnitude one
    significant digit (``-0.4%``, ``+0.03%``); ``0%`` only when it is 0."""
    if pct == 0:
        return "0%"
    return f"{pct:+.1g}%" if abs(pct) < 1 else f"{pct:+.0f}%"


def figure_captions(frame: pd.DataFrame, table: Table1) -> str:
    """``figures.md``: the captions of Figures 1 and 2."""
    return f"# Figures\n\n{figure1_caption(frame)}\n\n{figure2_caption(table)}\n"
