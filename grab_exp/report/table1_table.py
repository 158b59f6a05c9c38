"""Table 1 as numbers and text: its rows (from ``conf/``), the idle-machine bench, mean ± std over
seeds, the cells and captions, and the published table (``paper_table1.csv``) next to ours.

The rows are those that ``conf/experiment/table1.yaml`` sweeps, each ``(variant, pipeline)`` from
its ``conf/row/<row>.yaml``; a run of any other ordering still gets a row (after them, labelled
from its name).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
from omegaconf import OmegaConf

from grab_exp.logging.files import shown
from grab_exp.report.collect import Record
from grab_exp.report.frames import ID_COLUMNS, ReportWarning, warn_skip
from grab_exp.report.render import cell, percent
from grab_exp.runner.rundir.identity import CONF_DIR, conf_choices
from grab_exp.runner.rundir.resolvers import variant_dir


def swept(experiment: str, key: str) -> list[str]:
    """The values ``conf/experiment/<experiment>.yaml`` sweeps ``key`` over, in its order."""
    params = OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml").hydra.sweeper.params
    return [value.strip() for value in str(params[key]).split(",")]


def table1_rows() -> tuple[tuple[str, str], ...]:
    """Table 1's rows as ``(variant, pipeline)``, in the order ``conf/experiment/table1.yaml``
    sweeps them, each from the ``/balance`` and ``/pipeline`` of its ``conf/row/<row>.yaml``."""
    rows = (conf_choices(f"row/{name}") for name in swept("table1", "row"))
    return tuple((chosen["balance"], chosen["pipeline"]) for chosen in rows)


#: Table 1's rows, in the report's order, as ``(variant, pipeline)`` (see :func:`table1_rows`).
ROW_ORDER = table1_rows()
#: The baseline every overhead is relative to: RR with the functional pipeline.
BASELINE: tuple[str, str] = ("rr", "functional")
EARLY_EPOCH = 5  # the report's "after 5 epochs" columns
#: Figure colors (Okabe-Ito) and ``(linestyle, marker)`` of the rows of :data:`ROW_ORDER`, in order;
#: other rows take a stable extra color and solid lines with dots.
COLORS = ("#7f7f7f", "#000000", "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7")
EXTRA_COLORS = ("#56B4E9", "#F0E442", "#8c564b", "#17becf", "#bcbd22", "#9467bd")
STYLES = (((0, (1, 1.2)), "o"), ("--", "x"), ("-", "s"), ("-.", "^"), ((0, (5, 1.5)), "v"))
STYLES += (("-", "D"), ((0, (3, 1, 1, 1, 1, 1)), "P"))


def row_label(variant: str, pipeline: str) -> str:
    """The row's display label from its names, e.g. ``RR (classic)``, ``RR (functional)``,
    ``Recursive pair``: a part of up to two letters is an acronym; the pipeline is named when
    it is not the functional one or when the variant has rows with both."""
    words = [word.upper() if len(word) <= 2 else word for word in variant.split("_")]
    name = " ".join(words)
    name = name[:1].upper() + name[1:]
    if pipeline != "functional" or [v for v, _ in ROW_ORDER].count(variant) > 1:
        return f"{name} ({pipeline})"
    return name


def row_rank(variant: str, pipeline: str) -> tuple[int, str, str]:
    """Sort key: the report's rows first in :data:`ROW_ORDER`, any others after, by name."""
    row = (variant, pipeline)
    return (ROW_ORDER.index(row), "", "") if row in ROW_ORDER else (len(ROW_ORDER), *row)


def color_of(variant: str, pipeline: str) -> str:
    """The row's color, one per row in every figure (see :data:`COLORS`)."""
    rank = row_rank(variant, pipeline)[0]
    if rank < len(COLORS):
        return COLORS[rank]
    return EXTRA_COLORS[sum(map(ord, variant_dir(variant, pipeline))) % len(EXTRA_COLORS)]


def line_style(variant: str, pipeline: str) -> tuple[object, str]:
    """The row's ``(linestyle, marker)``, so that rows drawn on top of each other stay apart."""
    rank = row_rank(variant, pipeline)[0]
    return STYLES[rank] if rank < len(STYLES) else ("-", ".")


def runs_frame(runs: Iterable[Record]) -> pd.DataFrame:
    """The tidy frame of Table 1's runs (records of :mod:`grab_exp.report.collect`), in the
    report's order; of two runs sharing variant, pipeline and seed, the later one is dropped with
    a warning (pass one sweep's runs)."""
    frames = [run_frame for run_frame, _ in runs]
    if not frames:
        return pd.DataFrame(columns=list(ID_COLUMNS))
    frame = pd.concat(frames, ignore_index=True)
    ids = frame[["run", "variant", "pipeline", "seed"]].drop_duplicates()
    duplicated = ids.duplicated(["variant", "pipeline", "seed"])
    for _, row in ids[duplicated].iterrows():
        warn_skip(
            f"skipping {row['run']}: another run of {row['variant']}/{row['pipeline']} "
            f"seed {row['seed']} was already collected (pass one sweep's directories)"
        )
    frame = frame[~frame["run"].isin(ids[duplicated]["run"])]
    pairs = zip(frame["variant"], frame["pipeline"].fillna(""), strict=True)
    keyed = frame.assign(_rank=[row_rank(v, p) for v, p in pairs])
    keyed = keyed.sort_values(["_rank", "seed", "run", "epoch"], kind="stable")
    return keyed.drop(columns="_rank").reset_index(drop=True)


# ------------------------------------------------------------------ the idle-machine bench


@dataclass
class BenchRows:
    """Table 1's rows of a ``python -m grab_exp.bench`` JSON: ``variant``, ``pipeline`` and the
    file's values (an ``epoch`` benchmark's ``step_ms`` and ``epoch_s``, :func:`read_epoch_bench`;
    a ``state`` one's ``state_mb``, :func:`read_training_state`).

    Attributes:
        rows: One row per Table 1 row of the file.
        source: The JSON file, as the report's captions name it.
        machine: The file's ``machine`` block (``commit``, ``dirty``, ``torch_threads``,
            ``cpu``, ``gpu``...; files written before a key existed lack it).
    """

    rows: pd.DataFrame
    source: str
    machine: dict = field(default_factory=dict)

    def describe_machine(self) -> str:
        """The commit that wrote the file, its torch threads and its processor, as the captions
        cite them, e.g. ``commit 1a2b3c4, 1 thread, Intel(R) Xeon(R) Processor``."""
        machine = self.machine
        commit = machine.get("commit")
        parts = [f"commit {commit[:7]}" if commit else "commit not recorded"]
        if machine.get("dirty"):
            parts[0] += " with uncommitted changes"
        threads = machine.get("torch_threads")
        if threads is not None:
            parts.append(f"{threads} thread" + ("" if threads == 1 else "s"))
        processor = machine.get("gpu") or machine.get("cpu")
        if processor:
            parts.append(processor)
        return ", ".join(parts)


def read_bench_rows(
    path: str | os.PathLike[str],
    benchmark: str,
    columns: dict[str, Callable[[dict], float]],
    name: str | None = None,
) -> BenchRows:
    """Table 1's rows of a ``python -m grab_exp.bench <benchmark>`` JSON.

    Args:
        path: The JSON file.
        benchmark: The benchmark that must have written it.
        columns: Column name -> its value from a row of the file.
        name: How captions cite the file (default: ``path`` relative to the working directory).

    Raises:
        ValueError: not a ``benchmark`` file, or without Table 1's rows.
    """
    data = json.loads(Path(path).read_text())
    if data.get("benchmark") != benchmark:
        raise ValueError(f"{path}: not a `python -m grab_exp.bench {benchmark}` file")
    keys = {variant_dir(*row): row for row in ROW_ORDER}  # the rows' run directory names
    rows = [
        {"variant": keys[r["row"]][0], "pipeline": keys[r["row"]][1],
         **{column: value(r) for column, value in columns.items()}}
        for r in data["rows"] if r["row"] in keys
    ]  # fmt: skip
    if not rows:
        raise ValueError(f"{path}: no Table 1 row ({', '.join(keys)})")
    return BenchRows(pd.DataFrame(rows), name or shown(path), data.get("machine", {}))


def read_epoch_bench(path: str | os.PathLike[str], name: str | None = None) -> BenchRows:
    """The Table 1 rows of an ``epoch`` benchmark JSON (its VRGD rows are left out).

    ``name`` is how captions cite the file (default: ``path`` relative to the working directory).

    Raises:
        ValueError: not an ``epoch`` benchmark, or without Table 1's rows.
    """
    columns = {"step_ms": lambda r: float(r["step_ms"]), "epoch_s": lambda r: float(r["epoch_s"])}
    return read_bench_rows(path, "epoch", columns, name)


def read_training_state(path: str | os.PathLike[str], name: str | None = None) -> BenchRows:
    """The Table 1 rows of a ``state`` benchmark JSON (``python -m grab_exp.bench state``):
    ``state_mb``, the MiB allocated for model, gradients, optimizer, per-sample buffer, ordering
    state and the step's peak.

    ``name`` is how captions cite the file (default: ``path`` relative to the working directory).

    Raises:
        ValueError: not a ``state`` benchmark, or without Table 1's rows.
    """
    return read_bench_rows(path, "state", {"state_mb": lambda r: r["total"] / 2**20}, name)


# ------------------------------------------------------------------ the numbers


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
            ``time_overhead_pct`` (from ``bench_epoch_s``) and ``mem_overhead_pct`` (relative to
            the functional RR row).
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
    data = aggregate(runs, metrics)
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
    in % over the functional RR row's (NaN without one).

    Returns:
        Whether ``data`` has a functional RR row.
    """
    base = data[(data["variant"] == BASELINE[0]) & (data["pipeline"] == BASELINE[1])]
    for name, column in (("time_overhead_pct", time_column), ("mem_overhead_pct", memory_column)):
        reference = float(base[column].iloc[0]) if not base.empty else float("nan")
        data[name] = 100.0 * (data[column] / reference - 1.0)
    return not base.empty


def versus_rr(table: Table1) -> pd.DataFrame:
    """Each row's train loss and test accuracy minus those of RR (functional), in means: public
    API for Python and the notebook (``notebooks/reproduce_figures.ipynb``), not a report file.

    Returns:
        ``label`` and ``<metric>_diff`` for the four loss/accuracy metrics, plus
        ``beats_rr_loss_early`` / ``beats_rr_acc_early`` (lower loss / higher accuracy at the
        early epoch). Empty when there is no functional RR row.
    """
    data = table.data
    base = data[(data["variant"] == BASELINE[0]) & (data["pipeline"] == BASELINE[1])]
    if base.empty:
        return pd.DataFrame()
    out = data[["variant", "pipeline", "label"]].copy()
    for metric in table.metrics[:4]:
        out[f"{metric}_diff"] = data[f"{metric}_mean"] - float(base[f"{metric}_mean"].iloc[0])
    out["beats_rr_loss_early"] = out[f"{table.metrics[1]}_diff"] < 0
    out["beats_rr_acc_early"] = out[f"{table.metrics[3]}_diff"] > 0
    return out


# ------------------------------------------------------------------ the text


_DECIMALS = {"train_loss": 4, "test_acc": 4, "time_s": 2, "peak": 1, "state": 2}
_MEMORY_NAMES = {
    "state": "Training state (MB, allocated)",
    "cuda_step": "Step peak CUDA mem. (MB)",
    "cuda": "Peak CUDA mem. (MB)",
    "rss": "Peak RSS (MB)",
    "mixed": "Peak mem. (MB)",
}


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


def display_frame(table: Table1) -> pd.DataFrame:
    """Table 1 as strings, one column per displayed quantity, ready for Markdown/LaTeX."""
    data, names = table.data, headers(table)
    shown = pd.DataFrame({"Row": data["label"], "Seeds": data["n_seeds"].astype(str)})
    for metric in table.metrics:
        shown[names[metric]] = [
            cell(m, s, decimals(metric))
            for m, s in zip(data[f"{metric}_mean"], data[f"{metric}_std"], strict=True)
        ]
    shown["Time, idle bench (s/epoch)"] = data["bench_epoch_s"].map(lambda s: cell(s, None, 2))
    shown["Time overhead (idle bench)"] = data["time_overhead_pct"].map(percent)
    shown["Mem. overhead"] = data["mem_overhead_pct"].map(percent)
    return shown


def caption(table: Table1) -> str:
    """Table 1's caption: what the cells are, the epochs and the memory measure."""
    final, early = epoch_note(table)
    memory = {
        "state": f"the training state's allocated bytes from {table.memory_file} (model, "
        "gradients, optimizer state, per-sample buffer, ordering state and the step's peak "
        "working memory; dataset excluded; one measurement per row, so no std)",
        "cuda_step": "peak CUDA memory allocated above the epoch start (dataset on the GPU "
        "excluded)",
        "cuda": "peak CUDA memory allocated (the dataset on the GPU included)",
        "rss": "peak process RSS (no CUDA device)",
        "mixed": "peak CUDA memory where measured, else peak process RSS",
    }[table.memory_source]
    bench = (
        "idle bench = training seconds per epoch on an otherwise idle machine (median step "
        f"time x steps per epoch) from {table.cite_time_source()}, the source of the time overhead"
        if table.time_source
        else "no idle-machine benchmark given, so no time overhead"
    )
    return (
        "Table 1 reproduced: mean ± std over seeds (Seeds = count); final columns at "
        f"{final}, early columns at {early}; time during the runs = mean training seconds per "
        "epoch as the jobs measured them (machine load included; "
        f"not comparable between rows); {bench}; memory = {memory}; "
        f"overheads relative to RR (functional). Device: {', '.join(table.devices)}."
    )


# ------------------------------------------------------------------ the paper side by side


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
    "state": "training state, allocated",
    "cuda_step": "step peak above epoch start",
    "cuda": "absolute peak, dataset on GPU incl.",
    "rss": "process RSS",
    "mixed": "CUDA or RSS",
}


def _paper_header(table: Table1, metric: str) -> str:
    header = PAPER_COLUMNS[paper_metric_map(table)[metric]]
    return header.format(memory=MEMORY_MEANING[table.memory_source])


def hardware_note(table: Table1, hardware: str | None = None) -> str:
    """What differs between our runs and the paper's: hardware, epochs, memory measure."""
    final, early = epoch_note(table)
    ours = ", ".join(table.devices) + (f" ({hardware})" if hardware else "")
    lines = [
        f"- Paper: {PAPER_HARDWARE}; {PAPER_EPOCHS} epochs; seeds {PAPER_SEEDS}; "
        "means only (no std published).",
        f"- Ours: device {ours}; final columns at {final}; early columns at {early}; seeds per "
        "row as in the Seeds column.",
    ]
    if table.final_epochs != [PAPER_EPOCHS]:
        lines.append(
            f"- Our final columns are at {final}, the paper's at ep. {PAPER_EPOCHS}: compare "
            "the early (epoch 5) columns, and the final ones only as a trend."
        )
    if table.memory_source == "cuda_step":
        lines.append(
            "- Our GPU memory is the peak above the epoch start: the dataset lives on the GPU "
            "in our runs (about 704 MiB for CIFAR-10), on the host in the paper's, so the "
            "absolute peak (mem/peak_cuda_mb) would hide the ordering's share."
        )
    if table.memory_source == "state":
        lines.append(
            f"- Our memory is the training state's allocated bytes ({table.memory_file}): "
            "model, gradients, optimizer state, the per-sample buffer, the ordering's state and "
            "the step's peak working memory, the dataset excluded, as the paper's peak GPU "
            "allocation of a process whose data lived on the host. Measured on the CPU from "
            "the tensors' sizes and the profiler's allocation events; on CUDA the same benchmark "
            "reads the caching allocator's counters. Buffers outside torch's allocator (oneDNN, "
            "cuDNN workspaces) and the CUDA context are not counted."
        )
    elif table.memory_source not in ("cuda", "cuda_step"):
        lines.append(  # "sorter": the committed results/table1 say so; reword when regenerating
            "- Our memory is the process's peak RSS (dataset, model, Python and the sorter), "
            "not GPU allocation: its absolute values and overheads are not comparable with "
            "the paper's GPU memory. RSS is a lifetime peak of the process: under a launcher "
            "whose workers run several jobs (joblib), a job's value can include an earlier "
            "job's peak."
        )
    if table.time_source:
        lines.append(
            "- Our time overheads come from the idle-machine benchmark "
            f"{table.cite_time_source()}: each row's training step timed in one process, "
            "interleaved, median. Our "
            "seconds per epoch are the jobs' own, measured while other work loaded the "
            "machine, and are not overheads."
        )
    else:
        lines.append(
            "- No idle-machine benchmark was given (--bench), so we show no time overhead: "
            "the jobs' own seconds per epoch include the machine's load."
        )
    return "\n".join(lines) + "\n"
