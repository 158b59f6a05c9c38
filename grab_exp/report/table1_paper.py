"""The published Table 1 (``paper_table1.csv``) next to ours: the merged numbers, the two display
tables (loss and accuracy; time and memory) and the notes on what differs between the setups."""

from __future__ import annotations

import os
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from grab_exp.report.render import cell, percent, to_latex, to_markdown
from grab_exp.report.table1_rows import row_label, row_rank
from grab_exp.report.table1_table import Table1, add_overheads
from grab_exp.report.table1_text import MB_NOTE, decimals, epoch_note, headers, increment
from grab_exp.runner.rundir.identity import CONF_DIR

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
#: the published table's columns, in the order of :attr:`Table1.metrics`, and their headers
#: (``{memory}``: what our memory column measures, :data:`MEMORY_MEANING`)
PAPER_COLUMNS = {
    "train_loss_final": f"Train loss (final, ep. {PAPER_EPOCHS})",
    "train_loss_epoch5": "Train loss (ep. 5)",
    "test_acc_final": f"Test acc. (final, ep. {PAPER_EPOCHS})",
    "test_acc_epoch5": "Test acc. (ep. 5)",
    "train_time_s_per_epoch": "Time (s/epoch)",
    "peak_gpu_mem_mb": "Peak GPU mem. (MB; ours: {memory})",
}
TITLE = "Table 1: ours (mean ± std over seeds) next to the paper (means)"
#: the two display tables: (title, our metrics by position in :attr:`Table1.metrics`)
PARTS = {"results": ("Loss and accuracy", (0, 1, 2, 3)), "cost": ("Time and memory", (4, 5))}


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
    add_overheads(paper, "train_time_s_per_epoch", "peak_gpu_mem_mb")
    return paper


def paper_metric_map(table: Table1) -> dict[str, str]:
    """Our metric name -> the paper's column (time per epoch, GPU memory, epoch 5...)."""
    return dict(zip(table.metrics, PAPER_COLUMNS, strict=True)) | {
        "time_overhead_pct": "time_overhead_pct",
        "mem_overhead_pct": "mem_overhead_pct",
        "mem_increment_mb": "mem_increment_mb",
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


def side_by_side_frame(table: Table1, paper: pd.DataFrame, part: str = "results") -> pd.DataFrame:
    """Display strings of one part of :data:`PARTS`: each quantity as ``ours`` (mean ± std) then
    ``paper``; the ``cost`` part adds the overheads, memory's in MB and in %."""
    merged, names = merge_paper(table, paper), headers(table)
    shown = pd.DataFrame({"Row": merged["label"], "Seeds": merged["n_seeds"].astype(str)})
    for metric in (table.metrics[i] for i in PARTS[part][1]):
        places = decimals(metric)
        shown[f"{names[metric]} ours"] = [
            cell(m, s, places)
            for m, s in zip(merged[f"{metric}_mean"], merged[f"{metric}_std"], strict=True)
        ]
        shown[f"{_paper_header(table, metric)} paper"] = [
            cell(v, float("nan"), places) for v in merged[f"{metric}_paper"]
        ]
    if part == "cost":
        shown["Time overhead ours (idle bench)"] = merged["time_overhead_pct"].map(percent)
        shown["Time overhead paper"] = merged["time_overhead_pct_paper"].map(percent)
        for side, suffix in (("ours", ""), ("paper", "_paper")):
            shown[f"Mem. overhead {side}"] = [
                f"{increment(mb)} ({percent(pct)})" if not pd.isna(pct) else "—"
                for mb, pct in zip(
                    merged[f"mem_increment_mb{suffix}"],
                    merged[f"mem_overhead_pct{suffix}"],
                    strict=True,
                )
            ]
    return shown


#: what our memory column measures, for the paper column's header
MEMORY_MEANING = {
    "state": "training state",
    "cuda_step": "step peak above epoch start",
    "cuda": "absolute peak, dataset on GPU incl.",
    "rss": "process RSS",
    "mixed": "CUDA or RSS",
}


def _paper_header(table: Table1, metric: str) -> str:
    header = PAPER_COLUMNS[paper_metric_map(table)[metric]]
    return header.format(memory=MEMORY_MEANING[table.memory_source])


def recursive_trees() -> tuple[int, int]:
    """The trees of the recursive rows as ``conf/`` sets them for Table 1: recursive's depth D
    (``conf/balance/recursive.yaml``) and recursive pair's levels, log2 of the batch size of
    ``conf/experiment/table1.yaml`` (its tree halves one mini-batch per level)."""
    depth = int(OmegaConf.load(CONF_DIR / "balance" / "recursive.yaml").depth)
    batch = int(OmegaConf.load(CONF_DIR / "experiment" / "table1.yaml").batch_size)
    return depth, batch.bit_length() - 1


def hardware_note(table: Table1, hardware: str | None = None) -> str:
    """What differs between our runs and the paper's: hardware, epochs, trees, time and memory."""
    final, early = epoch_note(table)
    ours = ", ".join(table.devices) + (f" ({hardware})" if hardware else "")
    lines = [
        f"- Paper: {PAPER_HARDWARE}; {PAPER_EPOCHS} epochs; seeds {PAPER_SEEDS}; "
        "means only (no std published).",
        f"- Ours: device {ours}; final columns at {final}; early columns at {early}; seeds per "
        "row as in the Seeds column; std is the sample std (ddof 1) over them.",
    ]
    if table.final_epochs != [PAPER_EPOCHS]:
        lines.append(
            f"- Our final columns are at {final}, the paper's at ep. {PAPER_EPOCHS}: compare "
            "the early (epoch 5) columns, and the final ones only as a trend."
        )
    lines += [_tree_note(), _memory_note(table), _time_note(table, hardware)]
    lines.append(
        "- The paper's overheads here are computed from its table (time and memory relative to "
        "its RR (functional) row), not the ranges its text states."
    )
    return "\n".join(lines) + "\n"


def _tree_note() -> str:
    depth, levels = recursive_trees()
    return (
        f"- Trees: recursive, depth D = {depth} (conf/balance/recursive.yaml); recursive pair "
        f"halves each mini-batch of {2**levels}, so log2({2**levels}) = {levels} levels and "
        f"{2**levels - 1} accumulators (it takes no depth). The paper's captions give D = 5 for "
        "both recursive rows."
    )


def _memory_note(table: Table1) -> str:
    if table.memory_source == "state":
        return (
            f"- Our memory is the training state ({table.memory_file}; {table.memory_machine}): "
            "model, gradients, momentum, the per-sample buffer, the ordering's state and the "
            "step's peak working memory (the CPU profiler's allocation events). It leaves out "
            "evaluation and the batches on the device, which the paper's peak GPU allocation "
            "(torch's allocator) may hold, so our base is smaller and our percentages larger: "
            f"compare the increments in MB, not the totals or percentages ({MB_NOTE})."
        )
    if table.memory_source == "cuda_step":
        return (
            "- Our GPU memory is the peak above the epoch start: the dataset lives on the GPU "
            "in our runs (about 704 MiB for CIFAR-10), on the host in the paper's, so the "
            "absolute peak (mem/peak_cuda_mb) would hide the ordering's share."
        )
    if table.memory_source == "cuda":
        return "- Our memory is the absolute CUDA peak, the dataset on the GPU included."
    return (
        "- Our memory is the process's peak RSS (dataset, model, Python and the ordering), "
        "not GPU allocation: its absolute values and overheads are not comparable with "
        "the paper's GPU memory. RSS is a lifetime peak of the process: under a launcher "
        "whose workers run several jobs (joblib), a job's value can include an earlier "
        "job's peak."
    )


def _time_note(table: Table1, hardware: str | None) -> str:
    if not table.time_source:
        return (
            "- No idle-machine benchmark was given (--bench), so we show no time overhead: "
            "the jobs' own seconds per epoch include the machine's load."
        )
    runs = f" The runs trained on {hardware}." if hardware else ""
    return (
        "- Our time overheads come from the idle-machine benchmark "
        f"{table.cite_time_source()}: each row's training step timed in one process, "
        "interleaved, median. Our seconds per epoch are the jobs' own, measured while other "
        f"work loaded the machine, and are not overheads.{runs}"
    )


def paper_markdown(table: Table1, paper: pd.DataFrame, hardware: str | None = None) -> str:
    """``table1_vs_paper.md``: the two parts of :data:`PARTS`, then the setup differences."""
    parts = [f"# {TITLE}\n"]
    for part, (title, _) in PARTS.items():
        parts.append(f"## {title}\n\n{to_markdown(side_by_side_frame(table, paper, part))}")
    parts.append(f"## Setup differences\n\n{hardware_note(table, hardware)}")
    return "\n".join(parts)


def paper_latex(table: Table1, paper: pd.DataFrame, hardware: str | None = None) -> str:
    """``table1_vs_paper.tex``: one table per part of :data:`PARTS`, the notes in the first."""
    note = " ".join(line.removeprefix("- ") for line in hardware_note(table, hardware).splitlines())
    return "\n".join(
        to_latex(
            side_by_side_frame(table, paper, part),
            f"{TITLE}: {title.lower()}." + (f" {note}" if part == "results" else ""),
            f"tab:vs-{part}",
        )
        for part, (title, _) in PARTS.items()
    )
