"""The one reader of runs: run directories (``metrics.csv``, ``summary.json``, ``.hydra/``) and W&B
runs, each into a record ``(frame, identity)``: its tidy frame (:mod:`grab_exp.report.frames`) and
its identity (:func:`grab_exp.runner.rundir.identity.read_identity`).

Runs that cannot be used (unfinished, missing or corrupt files, kept-aside ``*.old<k>`` copies)
are skipped with a :class:`ReportWarning` that names them. W&B runs come from the public API
(``wandb.Api().runs(...)``: ``id``, ``state``, ``job_type``, ``config``, ``path`` and
``scan_history()``, as documented for ``wandb.apis.public.Run``); fetching needs the network.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from grab_exp.logging.files import shown
from grab_exp.report.frames import (
    ID_COLUMNS,
    RunLoadError,
    check_complete,
    check_metrics,
    metric_columns,
    warn_skip,
)
from grab_exp.runner.rundir.identity import read_identity

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
_KEPT_ASIDE = re.compile(r"\.old\d+$")
Record = tuple[pd.DataFrame, dict[str, Any]]


def read_runs(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    """Every usable run at or under ``paths``, in directory order.

    Returns:
        ``(frame, identity)`` per run: its rows (:data:`ID_COLUMNS` then ``metrics.csv``'s
        columns) and its identity.

    Raises:
        FileNotFoundError: a path does not exist.
    """
    return _usable(_read_run, find_run_dirs(paths))


def _usable(read: Callable[[Any], Record], sources: Iterable[Any]) -> list[Record]:
    """``read(source)`` of every source but those it raises :class:`RunLoadError` for (warned)."""
    records = []
    for source in sources:
        try:
            records.append(read(source))
        except RunLoadError as error:
            warn_skip(str(error))
    return records


def find_run_dirs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Run directories at or under ``paths``: every folder holding a ``summary.json``.

    Args:
        paths: Run directories or sweep directories (searched recursively).

    Returns:
        The run directories, sorted, each once (``*.old<k>`` and summary-less ones: warned).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    found: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {path}")
        found.update(summary.parent.resolve() for summary in path.rglob(SUMMARY_FILE))
        marks = [*path.rglob(METRICS_FILE), *path.rglob(".hydra")]
        for orphan in sorted({mark.parent.resolve() for mark in marks} - found):
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


def _read_run(run_dir: Path) -> Record:
    """One finished run directory (see :func:`read_runs`).

    Raises:
        RunLoadError: the run is unfinished (e.g. ``interrupted``), its identity cannot be told,
            or its ``summary.json`` / ``metrics.csv`` is missing, corrupt or incomplete.
    """
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError) as error:
        raise RunLoadError(f"skipping {run_dir}: unreadable {SUMMARY_FILE} ({error})") from None
    if not isinstance(summary, dict):
        raise RunLoadError(f"skipping {run_dir}: {SUMMARY_FILE} is not a JSON object")
    if (status := summary.get("status")) != "finished":
        raise RunLoadError(f"skipping unfinished run {run_dir} (status {status!r})")
    identity = _identity(summary, None, run_dir, str(run_dir))
    metrics = check_complete(read_metrics(run_dir), summary.get("final") or {}, run_dir)
    return _record(metrics, identity, shown(run_dir), str(summary.get("device", "unknown")))


def read_metrics(run_dir: Path) -> pd.DataFrame:
    """``metrics.csv`` of ``run_dir`` as numbers, one row per completed epoch."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise RunLoadError(f"skipping {run_dir}: no {METRICS_FILE}")
    try:
        metrics = pd.read_csv(path)
    except (OSError, ValueError) as error:  # pandas' parser errors are ValueErrors
        raise RunLoadError(f"skipping {run_dir}: corrupt {METRICS_FILE} ({error})") from None
    return check_metrics(metrics, run_dir, METRICS_FILE)


def _identity(summary: dict, config: dict | None, run_dir: Path | None, where: str) -> dict:
    try:
        return read_identity(summary, config, run_dir)
    except ValueError as error:
        raise RunLoadError(f"skipping {where}: {error}") from None


def _record(metrics: pd.DataFrame, identity: dict, run: str, device: str) -> Record:
    """The run's rows: ``run``, its variant, pipeline and seed, ``device``, then ``metrics``."""
    ids = {"run": run, **{key: identity[key] for key in ("variant", "pipeline", "seed")}}
    ids["device"] = device
    return metrics.assign(**ids)[[*ID_COLUMNS, *metric_columns(metrics)]], identity


# ------------------------------------------------------------------ W&B


def read_wandb_runs(path: str, api: Any = None) -> list[Record]:
    """The finished training runs of ``ENTITY/PROJECT[/GROUP]`` (see :func:`read_api_runs`)."""
    if api is None:
        import wandb

        api = wandb.Api()
    project, group = parse_wandb_path(path)
    return read_api_runs(api.runs(project, filters={"group": group} if group else None))


def parse_wandb_path(path: str) -> tuple[str, str | None]:
    """``ENTITY/PROJECT[/GROUP]`` -> ``("ENTITY/PROJECT", GROUP or None)``.

    Raises:
        ValueError: fewer than two non-empty parts.
    """
    parts = path.strip("/").split("/", 2)
    if len(parts) < 2 or not all(parts[:2]):
        raise ValueError(f"--wandb wants ENTITY/PROJECT[/GROUP], got {path!r}")
    return "/".join(parts[:2]), (parts[2] if len(parts) == 3 and parts[2] else None)


def read_api_runs(runs: Iterable[Any]) -> list[Record]:
    """Public-API runs as records (see :func:`read_runs`); a run's identity is its config's.

    Report runs (``job_type == "report"``) are ignored; unfinished runs and runs whose
    identity or history cannot be read are skipped with a warning naming them.
    """
    return _usable(_read_api_run, (r for r in runs if getattr(r, "job_type", None) != "report"))


def _read_api_run(run: Any) -> Record:
    """One public-API run (:func:`read_api_runs`); raises :class:`RunLoadError` naming it."""
    path = getattr(run, "path", None)
    ref = "wandb:" + ("/".join(map(str, path)) if path else str(run.id))
    if run.state != "finished":
        raise RunLoadError(f"skipping unfinished W&B run {ref} (state {run.state!r})")
    config = dict(run.config or {})
    identity = _identity({}, config, None, f"W&B run {ref}")
    history = _history_frame(run.scan_history(), ref)
    return _record(history, identity, ref, _device(history, config))


def _history_frame(rows: Iterable[dict[str, Any]], ref: str) -> pd.DataFrame:
    """The run's epoch rows (``epoch`` from the logged key, else ``_step``), checked; an
    epoch logged twice (a resumed run) keeps its later row."""
    kept = []
    for row in rows:
        if row.get("train/loss") is None:
            continue
        epoch = row.get("epoch", row.get("_step"))
        kept.append({"epoch": epoch, **{k: v for k, v in row.items() if not k.startswith("_")}})
    frame = pd.DataFrame(kept)
    if frame.empty:
        frame = pd.DataFrame(columns=["epoch"])
    else:
        frame = frame.drop_duplicates("epoch", keep="last")
    return check_metrics(frame, f"W&B run {ref}", "history")


def _device(history: pd.DataFrame, config: dict[str, Any]) -> str:
    """``cuda`` when CUDA memory was logged, else the configured device (``cpu`` for auto)."""
    cuda = history.get("mem/peak_cuda_mb")
    if cuda is not None and cuda.notna().any():
        return "cuda"
    device = str(config.get("device", "auto"))
    return "cpu" if device == "auto" else device
