"""Table 1 as text: its cells (mean ± std where seeds vary, the single value where one
measurement stands for every seed), headers, a short caption and the notes under the table."""

from __future__ import annotations

import math

import pandas as pd

from grab_exp.report.render import cell, percent
from grab_exp.report.table1_rows import EARLY_EPOCH
from grab_exp.report.table1_table import Table1

_DECIMALS = {"train_loss": 4, "test_acc": 4, "test_ppl": 2, "time_s": 2, "peak": 1, "state": 2}
_MEMORY_NAMES = {
    "state": "Training state (MB, allocated)",
    "cuda_step": "Step peak CUDA mem. (MB)",
    "cuda": "Peak CUDA mem. (MB)",
    "rss": "Peak RSS (MB)",
    "mixed": "Peak mem. (MB)",
}
#: what the memory column measures, one sentence each
MEMORY_NOTES = {
    "state": "the training state's allocated bytes from {file} ({machine}): model, gradients, "
    "momentum, per-sample buffer, ordering state and the step's peak working memory (the CPU "
    "profiler's allocation events); evaluation, the batches and the dataset are not in it, so "
    "compare its increments over RR (functional), not its totals or percentages, with a GPU "
    "peak allocation; one measurement per row, the same for every seed",
    "cuda_step": "peak CUDA memory allocated above the epoch start (dataset on the GPU excluded)",
    "cuda": "peak CUDA memory allocated (the dataset on the GPU included)",
    "rss": "peak process RSS (no CUDA device)",
    "mixed": "peak CUDA memory where measured, else peak process RSS",
}
MB_NOTE = "MB = 2^20 bytes"
#: what ``±`` after a memory increment is (per-run memory only)
SE_NOTE = (
    "± after a memory increment: its standard error over seeds, sqrt(s^2/n + s_ref^2/n_ref); "
    "an increment within about two of them is within the seeds' spread, not a measured overhead"
)


def decimals(metric: str) -> int:
    """Decimals shown for ``metric`` (4 for losses and accuracies, 2 for s, 1 for MB)."""
    return next((d for prefix, d in _DECIMALS.items() if metric.startswith(prefix)), 3)


def epoch_note(table: Table1) -> tuple[str, str]:
    """The epochs of the final and early columns, e.g. ``("ep. 100", "ep. 5")``;
    the early one reads ``ep. 3, last`` when the runs stopped before epoch 5."""
    finals = table.final_epochs
    final = f"ep. {finals[0]}" if len(finals) == 1 else f"ep. {finals[0]}-{finals[-1]}"
    early = f"ep. {table.early_epoch}"
    if table.early_epoch < EARLY_EPOCH:
        early += ", last"
    return final, early


def headers(table: Table1) -> dict[str, str]:
    """Display header of each metric of ``table``."""
    final, early = epoch_note(table)
    names = [
        f"Train loss (final, {final})",
        f"Train loss ({early})",
        f"Test acc. (final, {final})",
        f"Test acc. ({early})",
        "Time (s/epoch, during the runs)",
        _MEMORY_NAMES[table.memory_source],
    ]
    return dict(zip(table.metrics, names, strict=True))


def cells(data: pd.DataFrame, metric: str) -> list[str]:
    """``mean ± std`` per row; the mean alone where no std exists (one measurement)."""
    places = decimals(metric)
    pairs = zip(data[f"{metric}_mean"], data[f"{metric}_std"], strict=True)
    return [cell(m, s, places) for m, s in pairs]


def increment(mb: float, se: float = float("nan")) -> str:
    """A memory increment over the baseline, e.g. ``+0.71 MB``, with its standard error where
    seeds spread it (``+6.78 ± 5.84 MB``); ``—`` when missing."""
    if mb is None or math.isnan(mb):
        return "—"
    return f"{mb:+.2f} MB" if math.isnan(se) else f"{mb:+.2f} ± {se:.2f} MB"


def display_frame(table: Table1) -> pd.DataFrame:
    """Table 1 as strings, one column per displayed quantity, ready for Markdown/LaTeX."""
    data, names = table.data, headers(table)
    shown = pd.DataFrame({"Row": data["label"], "Seeds": data["n_seeds"].astype(str)})
    for metric in table.metrics:
        shown[names[metric]] = cells(data, metric)
    for metric in table.task_metrics:  # a language model's perplexity
        shown[f"Test perplexity (final, {epoch_note(table)[0]})"] = cells(data, metric)
    shown["Time, idle bench (s/epoch)"] = data["bench_epoch_s"].map(lambda s: cell(s, None, 2))
    shown["Time overhead (idle bench)"] = data["time_overhead_pct"].map(percent)
    increments = zip(data["mem_increment_mb"], data["mem_increment_se_mb"], strict=True)
    shown["Mem. overhead"] = [
        f"{increment(mb, se)} ({percent(pct)})" if not math.isnan(pct) else "—"
        for (mb, se), pct in zip(increments, data["mem_overhead_pct"], strict=True)
    ]
    return shown


def caption(table: Table1) -> str:
    """Table 1's caption: one sentence; :func:`notes` says the rest."""
    final, early = epoch_note(table)
    return (
        "Table 1 reproduced: each row's mean ± sample std (ddof 1) over its seeds (Seeds), "
        f"final columns at {final}, early columns at {early}; overheads relative to RR "
        "(functional)."
    )


def notes(table: Table1) -> list[str]:
    """The notes under Table 1: what each column measures and where it comes from."""
    return [
        "Train loss: the mean loss of a full pass over the training set after the epoch "
        "(`train/loss`), not the mean of the epoch's step losses (`train/running_loss`).",
        "Time during the runs: mean training seconds per epoch as the jobs measured them, "
        "machine load included; not comparable between rows.",
        _time_note(table),
        f"Memory: {_memory_note(table)}; {MB_NOTE}" + _se_note(table) + ".",
        f"Device of the runs: {', '.join(table.devices)}.",
    ]


def _time_note(table: Table1) -> str:
    if not table.time_source:
        return "No idle-machine benchmark given, so no time overhead."
    return (
        "Time, idle bench: training seconds per epoch on an otherwise idle machine (median step "
        f"time x steps per epoch) from {table.cite_time_source()}, one measurement per row: "
        "the only source of the time overhead."
    )


def _se_note(table: Table1) -> str:
    """``; <SE_NOTE>`` where the memory increments have standard errors, else ``""``."""
    return f"; {SE_NOTE}" if table.data["mem_increment_se_mb"].notna().any() else ""


def _memory_note(table: Table1) -> str:
    text = MEMORY_NOTES[table.memory_source]
    return text.format(file=table.memory_file, machine=table.memory_machine)


def markdown_notes(table: Table1) -> str:
    """:func:`notes` as a Markdown list."""
    return "\n".join(f"- {note}" for note in notes(table)) + "\n"
