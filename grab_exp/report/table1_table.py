"""Table 1 as numbers: one row per variant/pipeline, mean and sample std (ddof 1) over seeds of
each metric, the idle-machine bench's seconds per epoch, and the overheads relative to RR
(functional), in percent and, for memory, in MB.

Its parts: the rows (:mod:`~grab_exp.report.table1_rows`), the bench files
(:mod:`~grab_exp.report.table1_bench`), the cells and captions
(:mod:`~grab_exp.report.table1_text`), the paper side by side
(:mod:`~grab_exp.report.table1_paper`) and the paired tests
(:mod:`~grab_exp.report.table1_stats`).
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field

import pandas as pd

from grab_exp.report.frames import ReportWarning

# grab_exp/bench and tests/bench import these from here (they live in table1_rows, table1_bench)
from grab_exp.report.table1_bench import (
    BenchRows,
    read_epoch_bench,  # noqa: F401
)
from grab_exp.report.table1_rows import (  # noqa: F401
    BASELINE,
    EARLY_EPOCH,
    ROW_ORDER,
    is_baseline,
    row_label,
    row_rank,
    swept,
)

MEMORY_COLUMNS = {
    "state": "state_mb",
    "cuda_step": "step_peak_cuda_mb",
    "cuda": "peak_cuda_mb",
    "rss": "peak_rss_mb",
    "mixed": "peak_mem_mb",
}


@dataclass
class Table1:
    """Table 1 and what its headers must say.

    Attributes:
        data: One row per variant/pipeline in the report's order: ``variant``, ``pipeline``,
            ``label``, ``n_seeds``, ``final_epoch``, ``mem_source``, then ``<metric>_mean`` and
            ``<metric>_std`` for each of :attr:`metrics`, then ``bench_epoch_s`` (idle-machine
            seconds per epoch from the ``epoch`` benchmark, NaN without it),
            ``time_overhead_pct`` (from ``bench_epoch_s``), ``mem_overhead_pct`` and
            ``mem_increment_mb`` (relative to the functional RR row). A memory column from a
            ``state`` bench has no std (one measurement stands for every seed).
        metrics: The metric names in column order, e.g. ``train_loss_final``,
            ``train_loss_epoch5``, ..., ``time_s_per_epoch``, ``peak_cuda_mb``.
        early_epoch: The epoch of the "early" columns: 5, or the last epoch when fewer ran.
        final_epochs: The distinct final epochs of the runs (one value in a clean sweep).
        memory_source: ``state`` (the training state's allocated bytes from a ``state``
            benchmark: what the paper's GPU memory column compares with), ``cuda_step`` (CUDA
            peak above the epoch start, see :func:`peak_memory`), ``cuda`` (absolute CUDA peak,
            runs that logged no step peak), ``rss`` or ``mixed``.
        devices: The distinct devices the runs trained on.
        time_source: The benchmark file of ``bench_epoch_s`` (``None``: no time overheads).
        time_machine: Its commit, threads and processor (:meth:`BenchRows.describe_machine`).
        memory_file: The ``state`` benchmark file of the memory column (``None``: the runs').
        memory_machine: Its commit, threads and processor (``None``: the runs').
        task_metrics: the task's own metrics beside them (``test_ppl_final``, the final test
            perplexity, for runs that logged one: a language model's), aggregated as the others.
    """

    data: pd.DataFrame
    metrics: list[str]
    early_epoch: int
    final_epochs: list[int]
    memory_source: str
    devices: list[str] = field(default_factory=list)
    time_source: str | None = None
    time_machine: str | None = None
    memory_file: str | None = None
    memory_machine: str | None = None
    task_metrics: list[str] = field(default_factory=list)

    def cite_time_source(self, separator: str = " ") -> str:
        """The benchmark file and, after ``separator``, its machine in parentheses."""
        return f"{self.time_source}{separator}({self.time_machine})"

    @property
    def memory_metric(self) -> str:
        """The name of the memory metric (``peak_cuda_mb``, ``peak_rss_mb`` or ``peak_mem_mb``)."""
        return MEMORY_COLUMNS[self.memory_source]


def per_run(frame: pd.DataFrame, early_epoch: int) -> pd.DataFrame:
    """One row per run: final and ``early_epoch`` values, mean time per epoch, peak memory."""
    rows = []
    for run, epochs in frame.groupby("run", sort=False):
        epochs = epochs.sort_values("epoch")
        last, early = epochs.iloc[-1], epochs[epochs["epoch"] == early_epoch].iloc[0]
        memory, source = peak_memory(epochs)
        rows.append(
            {
                "run": run,
                "variant": last["variant"],
                "pipeline": last["pipeline"],
                "seed": int(last["seed"]),
                "device": last["device"],
                "final_epoch": int(last["epoch"]),
                "train_loss_final": float(last["train/loss"]),
                "train_loss_early": float(early["train/loss"]),
                "test_acc_final": float(last["test/acc"]),
                "test_acc_early": float(early["test/acc"]),
                "test_ppl_final": float(last.get("test/ppl", float("nan"))),
                "time_s_per_epoch": float(epochs["time/epoch_s"].mean()),
                "peak_mem_mb": memory,
                "mem_source": source,
            }
        )
    return pd.DataFrame(rows)


def peak_memory(epochs: pd.DataFrame) -> tuple[float, str]:
    """A run's peak memory in MB over its epochs: CUDA where measured, else process RSS.

    On CUDA the step peak (above the epoch-start allocation) is the measure: our dataset
    lives on the GPU (about 704 MiB for CIFAR-10), the paper's on the host, so only the
    memory training steps add is comparable with the paper's peak GPU memory.
    """
    for column, source in (("mem/step_peak_cuda_mb", "cuda_step"), ("mem/peak_cuda_mb", "cuda")):
        peaks = epochs.get(column)
        if peaks is not None and peaks.notna().any():
            return float(peaks.max()), source
    rss = epochs.get("mem/peak_rss_mb")
    return (float(rss.max()) if rss is not None else float("nan")), "rss"


def build_table1(
    frame: pd.DataFrame,
    early_epoch: int = EARLY_EPOCH,
    bench: BenchRows | None = None,
    state: BenchRows | None = None,
) -> Table1:
    """Aggregate the tidy run frame into Table 1 (see :class:`Table1`).

    Args:
        frame: The frame of :func:`runs_frame` (local or W&B runs).
        early_epoch: The epoch of the early columns; lowered to the shortest run's last epoch
            when some run has fewer epochs.
        bench: Idle-machine step times (:func:`read_epoch_bench`),
            the only source of the time overheads.
        state: Training-state memory (:func:`read_training_state`): the memory column and its
            overheads instead of the runs' own peaks.

    Raises:
        ValueError: ``frame`` holds no runs.
    """
    if frame.empty:
        raise ValueError("no finished runs to report")
    early = min(early_epoch, int(frame.groupby("run")["epoch"].max().min()))
    runs = per_run(frame, early)
    finals = sorted(runs["final_epoch"].unique().tolist())
    if len(finals) > 1:
        warnings.warn(f"runs end at different epochs {finals}", ReportWarning, stacklevel=2)
    sources = set(runs["mem_source"])
    source = sources.pop() if len(sources) == 1 else "mixed"
    if state is not None:
        runs = runs.merge(state.rows, how="left").assign(peak_mem_mb=lambda r: r["state_mb"])
        runs = runs.drop(columns="state_mb").assign(mem_source="state")
        source = "state"
    renames = {
        "train_loss_early": f"train_loss_epoch{early}",
        "test_acc_early": f"test_acc_epoch{early}",
        "peak_mem_mb": MEMORY_COLUMNS[source],
    }
    runs = runs.rename(columns=renames)
    metrics = [
        "train_loss_final",
        renames["train_loss_early"],
        "test_acc_final",
        renames["test_acc_early"],
        "time_s_per_epoch",
        renames["peak_mem_mb"],
    ]
    task = ["test_ppl_final"] if runs["test_ppl_final"].notna().any() else []
    data = aggregate(runs, metrics + task)
    if source == "state":
        data[f"{metrics[-1]}_std"] = float("nan")  # one measurement, not a spread over seeds
    if bench:
        times = bench.rows[["variant", "pipeline", "epoch_s"]]
        data = data.merge(times.rename(columns={"epoch_s": "bench_epoch_s"}), how="left")
    else:
        data["bench_epoch_s"] = float("nan")
    # time: the idle-machine benchmark's only (a job's own timing on a shared machine is never
    # turned into an overhead)
    if not add_overheads(data, "bench_epoch_s", renames["peak_mem_mb"] + "_mean"):
        warnings.warn(
            "no functional RR row: overheads are not computed", ReportWarning, stacklevel=2
        )
    devices = sorted(runs["device"].astype(str).unique().tolist())
    return Table1(
        data,
        metrics,
        early,
        finals,
        source,
        devices,
        bench and bench.source,
        bench and bench.describe_machine(),
        state and state.source,
        state and state.describe_machine(),
        task,
    )


def aggregate(runs: pd.DataFrame, metrics: list[str]) -> pd.DataFrame:
    """Mean and sample std (ddof 1) over seeds of each metric, rows in the report's order."""
    rows = []
    for (variant, pipeline), group in runs.groupby(["variant", "pipeline"]):
        row = {
            "variant": variant,
            "pipeline": pipeline,
            "label": row_label(variant, pipeline),
            "n_seeds": int(group["seed"].nunique()),
            "final_epoch": int(group["final_epoch"].max()),
            "mem_source": "/".join(sorted(set(group["mem_source"]))),
        }
        for metric in metrics:
            row[f"{metric}_mean"] = float(group[metric].mean())
            row[f"{metric}_std"] = float(group[metric].std(ddof=1))
        rows.append(row)
    rows.sort(key=lambda row: row_rank(row["variant"], row["pipeline"]))
    return pd.DataFrame(rows)


def add_overheads(data: pd.DataFrame, time_column: str, memory_column: str) -> bool:
    """Add ``time_overhead_pct`` and ``mem_overhead_pct``: ``time_column`` and ``memory_column``
    in % over the functional RR row's (NaN without one), ``mem_increment_mb``: the memory
    above that row's, in the memory column's unit, and ``mem_increment_se_mb``: its standard
    error over seeds, ``sqrt(s^2 / n + s_ref^2 / n_ref)`` (NaN where the memory is one
    measurement per row, a bench's).

    Returns:
        Whether ``data`` has a functional RR row.
    """
    base = data[is_baseline(data)]
    for name, column in (("time_overhead_pct", time_column), ("mem_overhead_pct", memory_column)):
        reference = float(base[column].iloc[0]) if not base.empty else float("nan")
        data[name] = 100.0 * (data[column] / reference - 1.0)
        if name == "mem_overhead_pct":
            data["mem_increment_mb"] = data[column] - reference
            data["mem_increment_se_mb"] = _increment_se(data, base, column)
    return not base.empty


def _increment_se(data: pd.DataFrame, base: pd.DataFrame, mean_column: str) -> pd.Series:
    """Standard error of each row's mean minus the baseline's (``mean_column``'s ``_std``)."""
    std = mean_column.removesuffix("_mean") + "_std"
    if base.empty or std not in data:
        return data[mean_column] * float("nan")
    ref = float(base[std].iloc[0]) ** 2 / int(base["n_seeds"].iloc[0])
    se = (data[std] ** 2 / data["n_seeds"] + ref) ** 0.5
    return se.where(~is_baseline(data))


def versus_rr(table: Table1) -> pd.DataFrame:
    """Each row's train loss and test accuracy minus those of RR (functional), in means: public
    API for Python and the notebook (``notebooks/reproduce_figures.ipynb``), not a report file.

    Returns:
        ``label`` and ``<metric>_diff`` for the four loss/accuracy metrics, plus
        ``beats_rr_loss_early`` / ``beats_rr_acc_early`` (lower loss / higher accuracy at the
        early epoch). Empty when there is no functional RR row.
    """
    data = table.data
    base = data[is_baseline(data)]
    if base.empty:
        return pd.DataFrame()
    out = data[["variant", "pipeline", "label"]].copy()
    for metric in table.metrics[:4]:
        out[f"{metric}_diff"] = data[f"{metric}_mean"] - float(base[f"{metric}_mean"].iloc[0])
    out["beats_rr_loss_early"] = out[f"{table.metrics[1]}_diff"] < 0
    out["beats_rr_acc_early"] = out[f"{table.metrics[3]}_diff"] > 0
    return out
