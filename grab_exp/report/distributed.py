"""``python -m grab_exp.report distributed RUNS... --out DIR``: a data-parallel sweep's table.

Train loss per epoch (mean ± std over seeds) and the final test accuracy per ordering
(``cd_grab``, ``d_grab``, ``d_rr``), and each ordering's per-seed final train loss minus
D-RR's. Writes ``table.csv``, ``table.md`` and ``per_epoch.csv`` (every run's rows).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from grab_exp.report.collect import read_runs
from grab_exp.report.frames import metric_columns
from grab_exp.report.render import to_markdown

ORDER = ("cd_grab", "d_grab", "d_rr")
BASELINE = "d_rr"


def load_distributed_runs(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """One row per (run, epoch) of every finished run at or under ``paths``.

    Columns: ``epoch``, the metrics of ``metrics.csv``, then ``variant`` and ``seed`` (from
    each run's identity). Unusable runs are skipped with a ``ReportWarning``.
    """
    frames = []
    for frame, identity in read_runs(paths):
        metrics = frame[["epoch", *metric_columns(frame)]]
        frames.append(metrics.assign(variant=identity["variant"], seed=identity["seed"]))
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def table(frame: pd.DataFrame, epochs: list[int]) -> pd.DataFrame:
    """Mean ± std over seeds of train loss at ``epochs`` and of the final test accuracy."""
    last = frame["epoch"].max()
    rows = []
    for variant in [v for v in ORDER if v in set(frame["variant"])]:
        runs = frame[frame["variant"] == variant]
        row = {"ordering": variant, "seeds": runs["seed"].nunique()}
        for epoch in epochs:
            values = runs[runs["epoch"] == epoch]["train/loss"]
            row[f"train loss ep. {epoch}"] = f"{values.mean():.4f} ± {values.std():.4f}"
        acc = runs[runs["epoch"] == last]["test/acc"]
        row[f"test acc. ep. {last}"] = f"{acc.mean():.4f} ± {acc.std():.4f}"
        rows.append(row)
    return pd.DataFrame(rows)


def paired(frame: pd.DataFrame, baseline: str = BASELINE) -> pd.DataFrame:
    """Per-seed final train-loss difference of each ordering to ``baseline``."""
    last = frame[frame["epoch"] == frame["epoch"].max()].pivot(
        index="seed", columns="variant", values="train/loss"
    )
    return last.sub(last[baseline], axis=0).drop(columns=baseline).round(4)


def write_tables(frame: pd.DataFrame, out: Path) -> list[Path]:
    """Write ``table.csv``, ``table.md`` and ``per_epoch.csv`` under ``out``.

    Args:
        frame: :func:`load_distributed_runs`'s frame.
        out: The output folder (created).

    Returns:
        The written paths.
    """
    last = int(frame["epoch"].max())
    shown = table(frame, sorted({1, 2, 5, last}))
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "table.csv", out / "table.md", out / "per_epoch.csv"]
    shown.to_csv(written[0], index=False)
    text = to_markdown(shown)
    if BASELINE in set(frame["variant"]):
        diffs = paired(frame).reset_index()
        text += f"\nFinal train loss minus {BASELINE}'s, per seed:\n\n{to_markdown(diffs)}"
    written[1].write_text(text)
    frame.to_csv(written[2], index=False)
    return written


def add_arguments(cli: argparse.ArgumentParser) -> None:
    """The options of ``python -m grab_exp.report distributed``."""
    cli.add_argument("paths", nargs="+", help="sweep or run directories of data-parallel runs")
    cli.add_argument("--out", required=True, type=Path, help="where the tables go")


def run(args: argparse.Namespace) -> int:
    """Collect the runs and write the tables; 1 when there is no finished run."""
    frame = load_distributed_runs(args.paths)
    if frame.empty:
        print("error: no finished runs under the paths", file=sys.stderr)
        return 1
    for path in write_tables(frame, args.out):
        print(path)
    return 0
