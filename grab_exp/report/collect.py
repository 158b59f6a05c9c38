"""The one reader of runs: run directories (``metrics.csv``, ``summary.json``, ``.hydra/``) and W&B
runs, each into a record ``(frame, identity)``: its tidy frame (:mod:`grab_exp.report.frames`) and
its identity (:func:`grab_exp.runner.rundir.identity.read_identity`).

A run directory is read by :func:`read_run`, the one reader that the report and
``python -m grab_exp.logging upload`` share: under the run's lock, finished, every epoch present,
rows whole and equal to the summary's final row. Runs that cannot be used (unfinished, in use,
missing, corrupt or incomplete files, kept-aside ``*.old<k>`` copies) are skipped with a
:class:`ReportWarning` that names them; W&B's own folders are never searched.

W&B runs come from the public API (``wandb.Api().runs(...)``: ``id``, ``state``,
``job_type``, ``config``, ``path`` and ``scan_history()``, as documented for
``wandb.apis.public.Run``); fetching needs the network.
"""

from __future__ import annotations

import io
import json
import math
import os
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
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
from grab_exp.runner.rundir.lock import RunDirInUseError, reading_lock

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
#: a run's own files, read once under its lock; the upload sends those present
RUN_FILES = (METRICS_FILE, SUMMARY_FILE, ".hydra/config.yaml", ".hydra/overrides.yaml")
_KEPT_ASIDE = re.compile(r"\.old\d+$")
#: W&B's folders: its root in a run directory and one per W&B run (copies of a run's files)
_WANDB_FOLDER = re.compile(r"^(wandb|(offline-)?run-\d{8}_\d{6}-\w+)$")
Record = tuple[pd.DataFrame, dict[str, Any]]


@dataclass(frozen=True)
class CheckedRun:
    """A finished run directory as :func:`read_run` read and checked it.

    Attributes:
        run_dir: The run directory (resolved).
        summary: Its ``summary.json``.
        identity: Its identity (:func:`~grab_exp.runner.rundir.identity.read_identity`).
        metrics: ``metrics.csv`` as numbers, one row per epoch 1..n.
        files: The bytes of each of :data:`RUN_FILES` present, by path in the run directory,
            as read under the lock.
    """

    run_dir: Path
    summary: dict[str, Any]
    identity: dict[str, Any]
    metrics: pd.DataFrame
    files: dict[str, bytes]


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

    The search follows symlinked folders (each real folder once, so a link cycle ends) and
    never enters W&B's own folders (``wandb/``, ``offline-run-*``, ``run-*``), which hold
    copies of a run's files.

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
        folders = list(_folders(path))
        runs = {folder for folder, names in folders if SUMMARY_FILE in names}
        marks = {folder for folder, names in folders if {METRICS_FILE, ".hydra"} & names}
        for orphan in sorted(marks - runs):
            warn_skip(
                f"skipping {orphan}: no {SUMMARY_FILE} (a job that never started, or stopped first)"
            )
        found |= runs
    kept = []
    for run_dir in sorted(found):
        if _KEPT_ASIDE.search(run_dir.name):
            warn_skip(f"skipping {run_dir}: an earlier run kept aside by overwrite=true")
        else:
            kept.append(run_dir)
    return kept


def _folders(root: Path) -> Iterator[tuple[Path, set[str]]]:
    """Each real folder at or under ``root`` once (resolved) with its entries' names; symlinked
    folders followed, W&B's own folders left out."""
    seen: set[Path] = set()
    for folder, subfolders, files in os.walk(root, followlinks=True):
        real = Path(folder).resolve()
        if real in seen:  # a symlink back up, or a second link to one folder
            subfolders[:] = []
            continue
        seen.add(real)
        subfolders[:] = [name for name in subfolders if not _WANDB_FOLDER.match(name)]
        yield real, {*files, *subfolders}


def read_run(run_dir: Path) -> CheckedRun:
    """The one reader of a finished run directory, for the report and the upload alike.

    Holds the directory's lock shared while it reads (a job cannot take it meanwhile) and
    checks: ``summary.json`` a JSON object with status ``finished``; ``metrics.csv`` present,
    ending with a whole row, its epochs 1..n up to the summary's final epoch, every required
    cell a number and its last row equal to the summary's ``final`` row.

    Raises:
        RunLoadError: one line naming the run and what is wrong (``skipping <dir>: ...``).
    """
    try:
        with reading_lock(run_dir):
            files = {name: _read_bytes(run_dir / name) for name in RUN_FILES}
    except RunDirInUseError as error:
        raise RunLoadError(f"skipping {run_dir}: {error} (a job is writing it)") from None
    summary = _summary(run_dir, files[SUMMARY_FILE])
    if (status := summary.get("status")) != "finished":
        raise RunLoadError(
            f"skipping unfinished run {run_dir} (status {status!r}){_advice(status)}"
        )
    identity = _identity(summary, None, run_dir, str(run_dir))
    final = summary.get("final") or {}
    metrics = check_complete(_metrics(run_dir, files[METRICS_FILE]), final, run_dir)
    _check_final_row(metrics, final, run_dir)
    kept = {name: data for name, data in files.items() if data is not None}
    return CheckedRun(run_dir, summary, identity, metrics, kept)


def _read_run(run_dir: Path) -> Record:
    """One finished run directory as a record (see :func:`read_runs`)."""
    run = read_run(run_dir)
    device = str(run.summary.get("device", "unknown"))
    return _record(run.metrics, run.identity, shown(run_dir), device)


def _read_bytes(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise RunLoadError(f"skipping {path.parent}: unreadable {path.name} ({error})") from None


def _summary(run_dir: Path, data: bytes | None) -> dict[str, Any]:
    try:
        summary = json.loads(data if data is not None else b"")
    except ValueError as error:
        why = error if data is not None else "missing"
        raise RunLoadError(f"skipping {run_dir}: unreadable {SUMMARY_FILE} ({why})") from None
    if not isinstance(summary, dict):
        raise RunLoadError(f"skipping {run_dir}: {SUMMARY_FILE} is not a JSON object")
    return summary


def read_metrics(run_dir: Path) -> pd.DataFrame:
    """``metrics.csv`` of ``run_dir`` as numbers, one row per completed epoch."""
    return _metrics(run_dir, _read_bytes(run_dir / METRICS_FILE))


def _metrics(run_dir: Path, data: bytes | None) -> pd.DataFrame:
    """``metrics.csv``'s bytes as checked numbers (exactly the values written)."""
    if data is None:
        raise RunLoadError(f"skipping {run_dir}: no {METRICS_FILE}")
    try:
        metrics = pd.read_csv(io.BytesIO(data))
    except (OSError, ValueError) as error:  # pandas' parser errors are ValueErrors
        raise RunLoadError(f"skipping {run_dir}: corrupt {METRICS_FILE} ({error})") from None
    metrics = check_metrics(metrics, run_dir, METRICS_FILE)
    if not data.endswith(b"\n"):
        raise RunLoadError(
            f"skipping {run_dir}: incomplete {METRICS_FILE} (it ends in half a row: a write cut "
            "short); rerun with overwrite=true"
        )
    return metrics


def _check_final_row(metrics: pd.DataFrame, final: dict[str, Any], run_dir: Path) -> None:
    """The last row of ``metrics.csv`` holds the summary's ``final`` numbers exactly."""
    last = metrics.iloc[-1]
    differ = [
        key
        for key, value in final.items()
        if isinstance(value, (int, float)) and key in last and not _same(last[key], value)
    ]
    if differ:
        raise RunLoadError(
            f"skipping {run_dir}: {METRICS_FILE}'s last row differs from {SUMMARY_FILE}'s final "
            f"row in {differ}; rerun with overwrite=true"
        )


def _same(cell: Any, value: float) -> bool:
    return bool(cell == value or (math.isnan(cell) and math.isnan(value)))


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


def _advice(status: object) -> str:
    """What to do about an unfinished run whose lock no job holds (read under it)."""
    if status == "running":  # no job holds its lock: it ended without writing its status
        return ": no job holds it (killed or crashed); the command that started it resumes it"
    if status == "interrupted":
        return ": the command that started it resumes it"
    return ": its summary.json's error says why; the command that started it runs it again"


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
