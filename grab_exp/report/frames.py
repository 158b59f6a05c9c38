"""The tidy run frame: its columns and the check of a metrics table; the report's errors.

One row per (run, epoch): ``run`` (where it came from), ``variant``, ``pipeline``, ``seed``,
``device``, ``epoch`` and the metric columns (``train/loss``, ``test/acc``, ``time/epoch_s``,
...). :mod:`grab_exp.report.collect` builds it from run directories and from W&B runs.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

ID_COLUMNS = ("run", "variant", "pipeline", "seed", "device", "epoch")
REQUIRED_METRICS = ("train/loss", "test/acc", "time/epoch_s")


class ReportWarning(UserWarning):
    """A run was left out of the report (the message says which and why)."""


class RunLoadError(ValueError):
    """A run cannot be read; the message names it."""


def warn_skip(message: str) -> None:
    """Warn (as a :class:`ReportWarning`) that a run was left out."""
    warnings.warn(message, ReportWarning, stacklevel=3)


def check_metrics(metrics: pd.DataFrame, run_dir: Path | str, what: str) -> pd.DataFrame:
    """Check a metrics table: required columns, numeric cells, whole epochs 1, 2, ..., n.

    Args:
        metrics: The table as read (``metrics.csv`` or a W&B history).
        run_dir: The run, for the message.
        what: The table's source, for the message.

    Returns:
        The table as numbers, sorted by epoch.

    Raises:
        RunLoadError: naming ``run_dir`` and ``what`` and the problem.
    """
    if problem := _metrics_problem(metrics):
        raise RunLoadError(f"skipping {run_dir}: corrupt {what} ({problem})")
    numeric = metrics.apply(pd.to_numeric, errors="coerce")
    numeric["epoch"] = numeric["epoch"].astype(int)
    return numeric.sort_values("epoch", ignore_index=True)


def check_complete(
    metrics: pd.DataFrame, final: Mapping[str, Any], run_dir: Path | str, what: str = "metrics.csv"
) -> pd.DataFrame:
    """A finished run's metrics table (``what``) has every epoch up to the summary's final one,
    and a value in every row for each column the summary's final row has a value for.

    Returns:
        ``metrics``, unchanged.

    Raises:
        RunLoadError: naming the run, what is missing and what to do.
    """
    last = final.get("epoch")
    if last is not None and list(metrics["epoch"]) != list(range(1, int(last) + 1)):
        problem = f"epochs up to {metrics['epoch'].iloc[-1]} of the {last} the summary finished"
    else:
        filled = [k for k, v in final.items() if v is not None]
        empty = [k for k in filled if k not in metrics or metrics[k].isna().any()]
        problem = f"empty or missing cells in {empty}" if empty else None
    if problem:
        raise RunLoadError(
            f"skipping {run_dir}: incomplete {what} ({problem}); rerun with overwrite=true"
        )
    return metrics


def _metrics_problem(metrics: pd.DataFrame) -> str | None:
    missing = [c for c in ("epoch", *REQUIRED_METRICS) if c not in metrics.columns]
    if missing:
        return f"missing columns {missing}"
    if metrics.empty:
        return "no epochs"
    numeric = metrics.apply(pd.to_numeric, errors="coerce")
    bad = [c for c in ("epoch", *REQUIRED_METRICS) if numeric[c].isna().any()]
    if bad:
        return f"non-numeric or empty cells in {bad}"
    if sorted(numeric["epoch"]) != list(range(1, len(numeric) + 1)):
        return f"epochs {list(numeric['epoch'])} are not 1..{len(numeric)}"
    return None


def metric_columns(frame: pd.DataFrame) -> list[str]:
    """The metric columns of a frame (everything but :data:`ID_COLUMNS`)."""
    return [c for c in frame.columns if c not in ID_COLUMNS]
