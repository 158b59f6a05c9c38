"""Test support: read offline W&B runs back from their ``.wandb`` transaction logs with W&B's own
reader, to check what a job logged without the network.

W&B 0.31 has no Python reader for ``.wandb`` files any more (``wandb.sdk.internal.datastore``
was removed when the SDK moved to the ``wandb-core`` service). Its reader is the documented
command ``wandb leet inspect --json FILE``, which runs ``wandb-core`` and prints one JSON
object per record: ``{"num": n, "type": "run" | "config" | "history" | "summary" | "exit" |
..., "<type>": {...}}``. This module runs that command (as ``python -m wandb`` of the current
interpreter) and folds the records into a run.

A resumed offline run leaves one ``offline-run-<time>-<id>`` folder per attempt, all with the
same run id; :func:`read_offline_runs` merges them by id, in start-time order, the later attempt
winning where two attempts logged the same step.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}
_INSPECT_TIMEOUT_S = 300  # seconds for one file; the reader is a subprocess


def read_offline_run(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read the single W&B run found under ``path``.

    Args:
        path: A ``.wandb`` file, an ``offline-run-*`` folder, a ``wandb`` folder, or any folder
            above them (such as the job's run directory).

    Returns:
        ``{"run_id", "project", "group", "name", "tags", "config", "history", "summary",
        "exit_code", "files"}``. ``history`` is a list of dicts sorted by ``_step`` (the
        step passed to ``log``); ``exit_code`` is ``None`` when the last attempt never
        finished.

    Raises:
        FileNotFoundError: no ``.wandb`` file under ``path``.
        ValueError: the files belong to more than one run id.
        RuntimeError: W&B's reader failed.
    """
    runs = read_offline_runs(path)
    if len(runs) != 1:
        raise ValueError(f"expected one W&B run under {path}, found ids {sorted(runs)}")
    return next(iter(runs.values()))


def read_offline_runs(path: str | os.PathLike[str]) -> dict[str, dict[str, Any]]:
    """Read every W&B run under ``path``, merged by run id (see :func:`read_offline_run`)."""
    files = find_wandb_files(path)
    if not files:
        raise FileNotFoundError(f"no .wandb file under {path}")
    with ThreadPoolExecutor(max_workers=min(8, len(files))) as pool:
        segments = sorted(pool.map(_read_segment, files), key=_segment_order)
    grouped: dict[str, list[dict[str, Any]]] = {}
    for segment in segments:
        grouped.setdefault(segment["run_id"], []).append(segment)
    return {run_id: _merge(parts) for run_id, parts in grouped.items()}


def find_wandb_files(path: str | os.PathLike[str]) -> list[Path]:
    """All ``run-*.wandb`` files at or under ``path``, each once (``latest-run`` links skipped)."""
    root = Path(path)
    if root.is_file():
        return [root.resolve()]
    unique = {file.resolve() for file in root.rglob("*.wandb") if file.is_file()}
    return sorted(unique)


def inspect_records(file: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The records of one ``.wandb`` file, decoded by ``wandb leet inspect --json``."""
    env = {**os.environ, "WANDB_MODE": "offline", "WANDB_SILENT": "true"}
    env["WANDB_ERROR_REPORTING"] = "false"
    command = [sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(file)]
    done = subprocess.run(
        command,
        capture_output=True,
        text=True,
        env=env,
        timeout=_INSPECT_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"`{' '.join(command)}` failed ({done.returncode}): {done.stderr}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


def _read_segment(file: Path) -> dict[str, Any]:
    """Fold one file's records into a partial run (one attempt of a job)."""
    segment: dict[str, Any] = {
        "run_id": file.stem.removeprefix("run-"),
        "start_time": "",
        "file": str(file),
        "run": {},
        "config": {},
        "history": {},
        "summary": {},
        "exit_code": None,
    }
    for record in inspect_records(file):
        _apply(segment, record.get("type"), record.get(record.get("type") or "", {}))
    return segment


def _apply(segment: dict[str, Any], kind: str | None, body: dict[str, Any]) -> None:
    if kind == "run":
        segment["run"] = body
        segment["run_id"] = body.get("run_id") or segment["run_id"]
        segment["start_time"] = body.get("start_time", "")
        _update(segment["config"], body.get("config", {}))
    elif kind == "config":
        _update(segment["config"], body)
    elif kind == "summary":
        _update(segment["summary"], body)
    elif kind == "history":
        row = _decode(body.get("item", {}))
        step = body.get("step", {}).get("num", row.get("_step", 0))
        row.setdefault("_step", step)
        segment["history"].setdefault(int(step), {}).update(row)
    elif kind == "exit":
        segment["exit_code"] = body.get("exit_code", 0)


def _update(target: dict[str, Any], change: dict[str, Any]) -> None:
    """Apply a config/summary record: ``{"update": {...}, "remove": [...]}``."""
    target.update(_decode(change.get("update", {})))
    for key in _removed_keys(change.get("remove", [])):
        target.pop(key, None)


def _removed_keys(removed: Iterable[Any]) -> Iterable[str]:
    for entry in removed:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict) and "key" in entry:
            yield entry["key"]


def _decode(values: dict[str, Any]) -> dict[str, Any]:
    """Turn W&B's JSON spellings of non-finite floats back into floats."""
    return {
        key: _NON_FINITE.get(value, value) if isinstance(value, str) else value
        for key, value in values.items()
    }


def _segment_order(segment: dict[str, Any]) -> tuple[str, str]:
    return segment["start_time"], segment["file"]


def _merge(segments: list[dict[str, Any]]) -> dict[str, Any]:
    """Merge the attempts of one run, oldest first; later attempts win."""
    config: dict[str, Any] = {}
    summary: dict[str, Any] = {}
    history: dict[int, dict[str, Any]] = {}
    run: dict[str, Any] = {}
    for segment in segments:
        config.update(segment["config"])
        summary.update(segment["summary"])
        run.update({key: value for key, value in segment["run"].items() if value})
        for step, row in segment["history"].items():
            history.setdefault(step, {}).update(row)
    config.pop("_wandb", None)
    return {
        "run_id": segments[-1]["run_id"],
        "project": run.get("project"),
        "group": run.get("run_group"),
        "name": run.get("display_name"),
        "tags": list(run.get("tags", [])),
        "config": config,
        "history": [history[step] for step in sorted(history)],
        "summary": summary,
        "exit_code": segments[-1]["exit_code"],
        "files": [segment["file"] for segment in segments],
        "git": run.get("git", {}),
    }
