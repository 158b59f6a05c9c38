"""The published Table 1 (``paper_table1.csv``) next to ours, with a note on the hardware."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from grab_exp.report.render import cell, decimals, epoch_note, headers, percent
from grab_exp.report.table import Table1
from grab_exp.report.variants import BASELINE, row_label, row_rank

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Where the published table is looked for: a copy committed in the repo, else the shared
#: reference next to the checkout.
PAPER_CANDIDATES = (
    REPO_ROOT / "results" / "paper_table1.csv",
    REPO_ROOT.parent / "shared" / "reference" / "paper_table1.csv",
)
PAPER_HARDWARE = "NVIDIA GeForce RTX 2060 GPU (12-core AMD Ryzen 1920X CPU, 64 GB RAM)"
PAPER_EPOCHS = 100
PAPER_SEEDS = "0, 7, 42"
PAPER_COLUMNS = (
    "train_loss_final",
    "train_loss_epoch5",
    "test_acc_final",
    "test_acc_epoch5",
    "train_time_s_per_epoch",
    "peak_gpu_mem_mb",
)


def default_paper_csv() -> Path:
    """The first existing file of :data:`PAPER_CANDIDATES` (else the last candidate)."""
    return next((path for path in PAPER_CANDIDATES if path.is_file()), PAPER_CANDIDATES[-1])


DEFAULT_PAPER_CSV = default_paper_csv()


def read_paper(path: str | os.PathLike[str] | None = None) -> pd.DataFrame:
    """The published Table 1 (default: :func:`default_paper_csv`), with its overheads
    relative to RR (functional) added.

    Raises:
        FileNotFoundError: no file at ``path``.
        ValueError: the file lacks a column of :data:`PAPER_COLUMNS`.
    """
    path = default_paper_csv() if path is None else path
    paper = pd.read_csv(path)
    missing = [c for c in ("variant", "pipeline", *PAPER_COLUMNS) if c not in paper.columns]
    if missing:
        raise ValueError(f"{path} lacks columns {missing}")
    base = paper[(paper["variant"] == BASELINE[0]) & (paper["pipeline"] == BASELINE[1])]
    for name, column in (
        ("time_overhead_pct", "train_time_s_per_epoch"),
        ("mem_overhead_pct", "peak_gpu_mem_mb"),
    ):
        reference = float(base[column].iloc[0]) if not base.empty else float("nan")
        paper[name] = 100.0 * (paper[column] / reference - 1.0)
    return paper


def paper_metric_map(table: Table1) -> dict[str, str]:
    """Our metric name -> the paper's column (time per epoch, GPU memory, epoch 5...)."""
    return dict(zip(table.metrics, PAPER_COLUMNS, strict=True)) | {
        "time_overhead_pct": "time_overhead_pct",
        "mem_overhead_pct": "mem_overhead_pct",
    }


def merge_paper(table: Table1, paper: pd.DataFrame) -> pd.DataFrame:
    """Our numeric Table 1 with ``<metric>_paper`` columns; rows of either side kept."""
    mapping = paper_metric_map(table)
    published = paper[["variant", "pipeline", *mapping.values()]].rename(
        columns={theirs: f"{ours}_paper" for ours, theirs in mapping.items()}
    )
    merged = table.data.merge(published, on=["variant", "pipeline"], how="outer")
    merged["label"] = [
        row_label(v, p) for v, p in zip(merged["variant"], merged["pipeline"], strict=True)
    ]
    merged["n_seeds"] = merged["n_seeds"].fillna(0).astype(int)
    order = sorted(
        range(len(merged)), key=lambda i: row_rank(*merged.iloc[i][["variant", "pipeline"]])
    )
    return merged.iloc[order].reset_index(drop=True)


def side_by_side_frame(table: Table1, paper: pd.DataFrame) -> pd.DataFrame:
    """Display strings: each quantity as ``ours`` (mean ± std) then ``paper`` columns."""
    merged, names = merge_paper(table, paper), headers(table)
    shown = pd.DataFrame({"Row": merged["label"], "Seeds": merged["n_seeds"].astype(str)})
    for metric in table.metrics:
        places = decimals(metric)
        shown[f"{names[metric]} ours"] = [
            cell(m, s, places)
            for m, s in zip(merged[f"{metric}_mean"], merged[f"{metric}_std"], strict=True)
        ]
        shown[f"{_paper_header(table, metric)} paper"] = [
            cell(v, float("nan"), places) for v in merged[f"{metric}_paper"]
        ]
    for name, ours, title in (
        ("time_overhead_pct", "Time overhead (idle bench)", "Time overhead"),
        ("mem_overhead_pct", "Mem. overhead", "Mem. overhead"),
    ):
        shown[f"{ours} ours"] = merged[name].map(percent)
        shown[f"{title} paper"] = merged[f"{name}_paper"].map(percent)
    return shown


#: what our memory column measures, for the paper column's header
MEMORY_MEANING = {
    "cuda_step": "step peak above epoch start",
    "cuda": "absolute peak, dataset on GPU incl.",
    "rss": "process RSS",
    "mixed": "CUDA or RSS",
}


def _paper_header(table: Table1, metric: str) -> str:
    column = paper_metric_map(table)[metric]
    return {
        "train_loss_final": f"Train loss (final, ep. {PAPER_EPOCHS})",
        "train_loss_epoch5": "Train loss (ep. 5)",
        "test_acc_final": f"Test acc. (final, ep. {PAPER_EPOCHS})",
        "test_acc_epoch5": "Test acc. (ep. 5)",
        "train_time_s_per_epoch": "Time (s/epoch)",
        "peak_gpu_mem_mb": f"Peak GPU mem. (MB; ours: {MEMORY_MEANING[table.memory_source]})",
    }[column]


def hardware_note(table: Table1, hardware: str | None = None) -> str:
    """What differs between our runs and the paper's: hardware, epochs, memory measure."""
    final, early = epoch_note(table)
    ours = ", ".join(table.devices) + (f" ({hardware})" if hardware else "")
    lines = [
        f"- Paper: {PAPER_HARDWARE}; {PAPER_EPOCHS} epochs; seeds {PAPER_SEEDS}; "
        "means only (no std published).",
        f"- Ours: device {ours}; final columns at {final.removeprefix('final, ')}; early "
        f"columns at {early}; seeds per row as in the Seeds column.",
    ]
    if table.final_epochs != [PAPER_EPOCHS]:
        lines.append(
            f"- Our final columns are at {final.removeprefix('final, ')}, the paper's at "
            f"ep. {PAPER_EPOCHS}: "
            "compare the early (epoch 5) columns, and the final ones only as a trend."
        )
    if table.memory_source == "cuda_step":
        lines.append(
            "- Our GPU memory is the peak above the epoch start: the dataset lives on the GPU "
            "in our runs (about 704 MiB for CIFAR-10), on the host in the paper's, so the "
            "absolute peak (mem/peak_cuda_mb) would hide the sorter's share."
        )
    if table.memory_source not in ("cuda", "cuda_step"):
        lines.append(
            "- Our memory is the process's peak RSS (dataset, model, Python and the sorter), "
            "not GPU allocation: its absolute values and overheads are not comparable with "
            "the paper's GPU memory. RSS is a lifetime peak of the process: under a launcher "
            "whose workers run several jobs (joblib), a job's value can include an earlier "
            "job's peak."
        )
    if table.time_source:
        lines.append(
            f"- Our time overheads come from the idle-machine benchmark {table.time_source} "
            "(each row's training step timed in one process, interleaved, median); our "
            "seconds per epoch are the jobs' own, measured while other work loaded the "
            "machine, and are not overheads."
        )
    else:
        lines.append(
            "- No idle-machine benchmark was given (--bench), so we show no time overhead: "
            "the jobs' own seconds per epoch include the machine's load."
        )
    return "\n".join(lines) + "\n"
