"""Collect run directories (``metrics.csv`` + ``summary.json``) into one tidy frame.

The frame has one row per (run, epoch): ``run`` (where it came from), ``variant``,
``pipeline``, ``seed``, ``device``, ``epoch`` and the metric columns of ``metrics.csv``
(``train/loss``, ``test/acc``, ``time/epoch_s``, ...). Runs that cannot be used (unfinished,
missing or corrupt files, kept-aside ``*.old<k>`` copies) are skipped with a
:class:`ReportWarning` that names their directory.
"""

from __future__ import annotations

import json
import os
import re
import warnings
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from grab_exp.report.variants import row_rank

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
ID_COLUMNS = ("run", "variant", "pipeline", "seed", "device", "epoch")
REQUIRED_METRICS = ("train/loss", "test/acc", "time/epoch_s")
_KEPT_ASIDE = re.compile(r"\.old\d+$")


class ReportWarning(UserWarning):
    """A run was left out of the report (the message says which and why)."""


class RunLoadError(ValueError):
    """A run directory cannot be read; the message names the directory."""


def find_run_dirs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Run directories at or under ``paths``: every folder holding a ``summary.json``.

    Args:
        paths: Run directories or sweep directories (searched recursively).

    Returns:
        The run directories, sorted, each once; kept-aside ``*.old<k>`` copies are skipped
        with a warning.

    Raises:
        FileNotFoundError: a path does not exist.
    """
    found: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {path}")
        found.update(summary.parent.resolve() for summary in path.rglob(SUMMARY_FILE))
        for orphan in sorted(job_dirs(path) - found):
            warn_skip(
                f"skipping {orphan}: no {SUMMARY_FILE} (a job that never started, or stopped first)"
            )
    kept = []
    for run_dir in sorted(found):
        if _KEPT_ASIDE.search(run_dir.name):
            warn_skip(f"skipping {run_dir}: an earlier run kept aside by overwrite=true")
        else:
            kept.append(run_dir)
    return kept


def job_dirs(path: Path) -> set[Path]:
    """Folders under ``path`` that a job made: they hold ``metrics.csv`` or Hydra's ``.hydra``."""
    marks = [*path.rglob(METRICS_FILE), *path.rglob(".hydra")]
    return {mark.parent.resolve() for mark in marks}


def load_run(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """One finished run's tidy frame (see the module docstring).

    Raises:
        RunLoadError: the run is unfinished, or its ``summary.json`` / ``metrics.csv`` is
            missing or corrupt; the message names ``run_dir``.
    """
    run_dir = Path(run_dir)
    summary = read_summary(run_dir)
    status = summary.get("status")
    if status != "finished":
        raise RunLoadError(f"skipping unfinished run {run_dir} (status {status!r})")
    metrics = read_metrics(run_dir)
    ids = {
        "run": str(run_dir),
        "variant": str(summary["variant"]),
        "pipeline": str(summary["pipeline"]),
        "seed": int(summary["seed"]),
        "device": str(summary.get("device", "unknown")),
    }
    return metrics.assign(**ids)[[*ID_COLUMNS, *metric_columns(metrics)]]


def read_summary(run_dir: Path) -> dict:
    """``summary.json`` of ``run_dir`` with its identifying keys checked."""
    path = run_dir / SUMMARY_FILE
    try:
        summary = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise RunLoadError(f"skipping {run_dir}: unreadable {SUMMARY_FILE} ({error})") from None
    if not isinstance(summary, dict):
        raise RunLoadError(f"skipping {run_dir}: {SUMMARY_FILE} is not a JSON object")
    missing = [key for key in ("variant", "pipeline", "seed") if summary.get(key) is None]
    if missing and summary.get("status") == "finished":
        raise RunLoadError(f"skipping {run_dir}: {SUMMARY_FILE} lacks {missing}")
    return summary


def read_metrics(run_dir: Path) -> pd.DataFrame:
    """``metrics.csv`` of ``run_dir`` as numbers, one row per completed epoch."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise RunLoadError(f"skipping {run_dir}: no {METRICS_FILE}")
    try:
        metrics = pd.read_csv(path)
    except (OSError, ValueError) as error:  # pandas' parser errors are ValueErrors
        raise RunLoadError(f"skipping {run_dir}: corrupt {METRICS_FILE} ({error})") from None
    return check_metrics(metrics, run_dir)


def check_metrics(
    metrics: pd.DataFrame, run_dir: Path | str, what: str = METRICS_FILE
) -> pd.DataFrame:
    """Check a metrics table: required columns, numeric cells, whole epochs 1, 2, ..., n.

    Raises:
        RunLoadError: naming ``run_dir`` and ``what`` (the table's source) and the problem.
    """
    problem = _metrics_problem(metrics)
    if problem:
        raise RunLoadError(f"skipping {run_dir}: corrupt {what} ({problem})")
    numeric = metrics.apply(pd.to_numeric, errors="coerce")
    numeric["epoch"] = numeric["epoch"].astype(int)
    return numeric.sort_values("epoch", ignore_index=True)


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


def load_runs(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """The tidy frame of every usable run at or under ``paths``.

    Unusable runs are skipped with a :class:`ReportWarning` naming their directory; when two
    runs share variant, pipeline and seed, the later-sorted directory is dropped with a
    warning (its settings differ: pass one sweep's runs).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    frames = []
    for run_dir in find_run_dirs(paths):
        try:
            frames.append(load_run(run_dir))
        except RunLoadError as error:
            warn_skip(str(error))
    return drop_duplicate_runs(concat_runs(frames))


def concat_runs(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Stack per-run frames; an empty frame with the id columns when there are none."""
    if not frames:
        return pd.DataFrame(columns=list(ID_COLUMNS))
    return pd.concat(frames, ignore_index=True)


def drop_duplicate_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Keep one run per (variant, pipeline, seed), warning about the others."""
    runs = frame[["run", "variant", "pipeline", "seed"]].drop_duplicates()
    duplicated = runs.duplicated(["variant", "pipeline", "seed"])
    for _, row in runs[duplicated].iterrows():
        warn_skip(
            f"skipping {row['run']}: another run of {row['variant']}/{row['pipeline']} "
            f"seed {row['seed']} was already collected (pass one sweep's directories)"
        )
    kept = frame[~frame["run"].isin(runs[duplicated]["run"])]
    return sort_runs(kept)


def sort_runs(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows in the report's order of variant/pipeline, then seed, then epoch."""
    if frame.empty:
        return frame.reset_index(drop=True)
    rank = [row_rank(v, p) for v, p in zip(frame["variant"], frame["pipeline"], strict=True)]
    keyed = frame.assign(_rank=rank).sort_values(["_rank", "seed", "run", "epoch"], kind="stable")
    return keyed.drop(columns="_rank").reset_index(drop=True)


def warn_skip(message: str) -> None:
    """Warn (as a :class:`ReportWarning`) that a run was left out."""
    warnings.warn(message, ReportWarning, stacklevel=3)
