"""``python -m grab_exp.logging upload RUNS...``: finished local runs into W&B, one W&B run each.

A job that trained without ``logger=wandb`` has everything W&B would show in its run directory.
Each run is read by the report's reader (:func:`grab_exp.report.collect.read_run`: finished,
every epoch present, rows whole, its lock free) or refused by name, and the upload goes on to the
next; the command ends with one line per run and exits 1 when it refused one.

A run goes to W&B as one run, grouped and named as the runner names the runs it mirrors (group:
the experiment; name: ``<variant>-<pipeline>-seed<k>``), with its history (one step per epoch),
its own config, its own git commit (``summary.json``'s) and its files as they were read.
Uploading is idempotent: the W&B id is derived from the run (:func:`derived_id`) and recorded in
the run directory (:data:`RECORD_FILE`), so a run uploaded before, or logged to W&B while it
trained (``summary.json``'s or the checkpoint's ``logger_ids``), is named and not sent again.
W&B keeps its own files in ``--dir`` (default: each run directory's ``wandb/``, which no reader
enters); offline, the command says why and prints the ``wandb sync`` command that uploads them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import math
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from grab_exp.logging.files import DamagedFileError, WriteError, read_json, shown, write_json
from grab_exp.logging.wandb_logger import WandbLogger, WandbUnavailableWarning
from grab_exp.logging.wandb_mode import mode_reason
from grab_exp.report.collect import METRICS_FILE, CheckedRun, find_run_dirs, read_run
from grab_exp.report.frames import RunLoadError
from grab_exp.runner.rundir.checkpoint import kept_logger_ids

#: the run directory's record of its upload: W&B id, project, mode and time
RECORD_FILE = "wandb_upload.json"


def derived_id(run: CheckedRun) -> str:
    """The W&B id of ``run``'s upload: a hash of its identity, its config's fingerprint and its
    ``metrics.csv``, so the same run always gets the same id (16 hex digits)."""
    fingerprint = run.summary.get("config_fingerprint") or {}
    key = {
        "identity": run.identity,
        "config": fingerprint.get("hash", fingerprint.get("config")),
        "metrics": hashlib.sha256(run.files[METRICS_FILE]).hexdigest(),
    }
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _nested(flat: dict[str, Any]) -> dict[str, Any]:
    """``{"a.b": 1}`` -> ``{"a": {"b": 1}}`` (the recorded flat config as W&B shows configs)."""
    nested: dict[str, Any] = {}
    for key, value in flat.items():
        *parents, leaf = key.split(".")
        node = nested
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return nested


def already_in_wandb(run: CheckedRun, project: str) -> str | None:
    """Why ``run`` is in W&B already (one line), or ``None``."""
    try:
        record = read_json(run.run_dir / RECORD_FILE) or {}
    except DamagedFileError:  # a record cut short: upload again (the same id)
        record = {}
    if record.get("id") == derived_id(run) and record.get("project") == project:
        return (
            f"already uploaded as W&B run {record['id']} ({record.get('mode')}, "
            f"{record.get('uploaded_at')}); delete {RECORD_FILE} to upload it again"
        )
    ids = run.summary.get("logger_ids") or kept_logger_ids(run.run_dir)
    if logged := (ids or {}).get("wandb"):
        return (
            f"logged to W&B as run {logged} while it trained (logger=wandb); an offline one "
            f"goes up with: wandb sync {shown(run.run_dir / 'wandb')}"
        )
    return None


def upload_run(run: CheckedRun, project: str, entity: str | None, mode: str, where: Path) -> str:
    """Put one checked run into W&B; return its line (``W&B run <id> ...``).

    Raises:
        RuntimeError: W&B failed (its first error, in one line).
    """
    summary, identity = run.summary, run.identity
    logger = WandbLogger(
        project=project,
        entity=entity,
        mode=mode,
        group=identity.get("experiment"),
        name=f"{identity.get('variant')}-{identity.get('pipeline')}-seed{identity.get('seed')}",
        tags=("uploaded",),
        git_commit=summary.get("git_commit"),
    )
    flat = (summary.get("config_fingerprint") or {}).get("config") or {}
    config = {**_nested(flat), "identity": identity, "git_commit": summary.get("git_commit")}
    run_id = derived_id(run)
    with warnings.catch_warnings():  # W&B's failure is this run's line, printed once
        warnings.simplefilter("ignore", WandbUnavailableWarning)
        logger.start(where, config, resume_id=run_id)
        for row in _rows(run):
            logger.log(row, row["epoch"])
        logger.save_files(run.files)
        sync_dir = logger.sync_dir
        logger.finish("finished", summary)
    if logger.failure or logger.mode == "disabled":
        raise RuntimeError(logger.failure or "W&B is disabled (WANDB_MODE=disabled)")
    _record(run, run_id, project, logger.mode)
    if logger.mode == "offline":
        return f"W&B run {run_id} (offline: wandb sync {shown(sync_dir)})"
    return f"W&B run {run_id}"


def _rows(run: CheckedRun) -> list[dict[str, Any]]:
    """``metrics.csv``'s rows as Python numbers; an empty cell is ``None`` (not logged)."""
    return [
        {key: _plain(value) for key, value in row.items()} for row in run.metrics.to_dict("records")
    ]


def _plain(value: Any) -> Any:
    value = value.item() if hasattr(value, "item") else value
    return None if isinstance(value, float) and math.isnan(value) else value


def _record(run: CheckedRun, run_id: str, project: str, mode: str) -> None:
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    record = {"id": run_id, "project": project, "mode": mode, "uploaded_at": now}
    try:
        write_json(run.run_dir / RECORD_FILE, record)
    except WriteError as error:  # uploaded all the same; a later upload resumes the same id
        print(f"warning: {error}", file=sys.stderr)


def upload_line(run_dir: Path, args: argparse.Namespace) -> tuple[bool, str]:
    """``(uploaded or recognised, the run's line)`` for one run directory."""
    try:
        run = read_run(run_dir)
    except RunLoadError as error:
        return False, f"{run_dir}: refused: {str(error).removeprefix('skipping ')}"
    if known := already_in_wandb(run, args.project):
        return True, f"{run_dir}: {known}; nothing sent"
    where = args.dir / run_dir.name if args.dir else run_dir
    try:
        return True, f"{run_dir}: {upload_run(run, args.project, args.entity, args.mode, where)}"
    except (RuntimeError, ValueError) as error:
        return False, f"{run_dir}: refused: {error}"


def main(argv: Sequence[str] | None = None) -> int:
    """``upload RUNS... [--project P] [--entity E] [--mode M] [--dir D]``; the exit status."""
    cli = argparse.ArgumentParser(prog="python -m grab_exp.logging", description=__doc__)
    commands = cli.add_subparsers(dest="command", metavar="COMMAND", required=True)
    upload = commands.add_parser("upload", help="finished local runs into W&B, one run each")
    upload.add_argument("runs", nargs="+", help="run directories, or folders holding them")
    upload.add_argument("--project", default="grab-exp", help="W&B project (default grab-exp)")
    upload.add_argument("--entity", default=None, help="W&B user or team (default: the key's)")
    upload.add_argument(
        "--mode",
        default="auto",
        choices=("auto", "online", "offline"),
        help="auto: WANDB_MODE if set, else online with an API key, else offline",
    )
    upload.add_argument(
        "--dir", type=Path, default=None, help="W&B's own files (default: each run directory)"
    )
    args = cli.parse_args(argv)
    try:
        with warnings.catch_warnings():  # the reader's warnings: each run's line says it
            warnings.simplefilter("ignore")
            run_dirs = find_run_dirs(args.runs)
        if not run_dirs:
            raise FileNotFoundError(f"no run directory (a folder with summary.json) in {args.runs}")
        mode = WandbLogger(mode=args.mode).mode
    except (FileNotFoundError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if mode == "offline":
        why = f"--mode {args.mode}" if args.mode != "auto" else mode_reason("auto")
        why = why.replace("logger.wandb.mode=auto", "--mode auto")
        print(f"W&B is offline ({why}): each run's line names the wandb sync command")
    lines = [upload_line(run_dir, args) for run_dir in run_dirs]
    for ok, line in lines:
        print(line, file=sys.stdout if ok else sys.stderr)
    return 0 if all(ok for ok, _ in lines) else 1
