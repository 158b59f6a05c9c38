"""``python -m grab_exp.report distributed RUNS... --out DIR``: a data-parallel sweep's table.

Train loss per epoch (mean ± std over seeds) and the final test accuracy per ordering (by name:
``cd_grab``, ``d_grab``, ``d_rr``, ...), and each ordering's per-seed final train loss minus
D-RR's. Writes ``table.csv``, ``table.md`` and ``per_epoch.csv`` (every run's
rows).
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from grab_exp.report.collect import read_runs
from grab_exp.report.frames import metric_columns
from grab_exp.report.render import to_markdown

BASELINE = "d_rr"


@dataclass
class Report:
    """What :func:`compute` makes of the runs."""

    frame: pd.DataFrame  # :func:`load`'s
    table: pd.DataFrame  # :func:`table`'s, at epochs 1, 2, 5 and the last
    paired: pd.DataFrame | None  # :func:`paired`'s; None without a D-RR run


def add_arguments(cli: argparse.ArgumentParser) -> None:
    """The options of ``python -m grab_exp.report distributed``."""
    cli.add_argument("paths", nargs="+", help="sweep or run directories of data-parallel runs")
    cli.add_argument("--out", required=True, type=Path, help="where the tables go")


def load(args: argparse.Namespace) -> pd.DataFrame:
    """One row per (run, epoch) of every finished run under ``args.paths``.

    Columns: ``epoch``, the metrics of ``metrics.csv``, then ``variant`` and ``seed`` (from
    each run's identity). Unusable runs are skipped with a ``ReportWarning``.

    Raises:
        ValueError: no finished run.
    """
    runs = read_runs(args.paths)
    frames = [frame[["epoch", *metric_columns(frame), "variant", "seed"]] for frame, _ in runs]
    if not frames:
        raise ValueError("no finished runs under the paths")
    return pd.concat(frames, ignore_index=True)


def compute(frame: pd.DataFrame, args: argparse.Namespace) -> Report:
    """The table at epochs 1, 2, 5 and the last, and the differences to D-RR when it ran."""
    shown = table(frame, sorted({1, 2, 5, int(frame["epoch"].max())}))
    diffs = paired(frame).reset_index() if BASELINE in set(frame["variant"]) else None
    return Report(frame, shown, diffs)


def write(report: Report, args: argparse.Namespace) -> list[Path]:
    """Write ``table.csv``, ``table.md`` and ``per_epoch.csv`` under ``args.out`` (created)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.csv", out / "table.md", out / "per_epoch.csv"]
    report.table.to_csv(written[0], index=False)
    text = to_markdown(report.table)
    if report.paired is not None:
        text += f"\nFinal train loss minus {BASELINE}'s, per seed:\n\n{to_markdown(report.paired)}"
    written[1].write_text(text)
    report.frame.to_csv(written[2], index=False)
    return written


def run(args: argparse.Namespace) -> int:
    """Load, compute and write; print the written files."""
    for path in write(compute(load(args), args), args):
        print(path)
    return 0


def table(frame: pd.DataFrame, epochs: list[int]) -> pd.DataFrame:
    """Mean ± std over seeds of train loss at ``epochs`` and of the final test accuracy."""
    last = frame["epoch"].max()
    rows = []
    for variant in sorted(set(frame["variant"])):
        runs = frame[frame["variant"] == variant]
        row = {"ordering": variant, "seeds": runs["seed"].nunique()}
        for epoch in epochs:
            values = runs[runs["epoch"] == epoch]["train/loss"]
            row[f"train loss ep. {epoch}"] = f"{values.mean():.4f} ± {values.std():.4f}"
        acc = runs[runs["epoch"] == last]["test/acc"]
        row[f"test acc. ep. {last}"] = f"{acc.mean():.4f} ± {acc.std():.4f}"
        rows.append(row)
    return pd.DataFrame(rows)


def paired(frame: pd.DataFrame) -> pd.DataFrame:
    """Per-seed final train-loss difference of each ordering to D-RR's (:data:`BASELINE`)."""
    last = frame[frame["epoch"] == frame["epoch"].max()].pivot(
        index="seed", columns="variant", values="train/loss"
    )
    return last.sub(last[BASELINE], axis=0).drop(columns=BASELINE).round(4)
