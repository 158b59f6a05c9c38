"""The local run store: ``metrics.csv`` (one row per epoch) and ``summary.json`` in a run directory.

The local store is always on and is the record of truth; W&B is a mirror of it.

* ``metrics.csv`` has a fixed column order chosen at construction, ``epoch`` first. Each
  :meth:`LocalStore.append` writes one row and flushes and fsyncs it, so a killed run loses at
  most the row it was writing. A resumed run calls :meth:`LocalStore.rewrite` with the metrics
  list of its checkpoint, which atomically replaces the file, so the file matches the checkpoint
  exactly (rows written after the checkpoint, or a half-written last row, disappear).
  ``None`` values are written as empty cells.
* ``summary.json`` is rewritten atomically by :meth:`LocalStore.write_summary`, which merges the
  new fields into the previous summary and stamps status, library versions, git commit and time.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grab_exp.logging.files import (
    atomic_write_text,
    damaged,
    fsync_dir,
    read_json,
    write_json,
    writing,
)
from grab_exp.logging.provenance import git_commit, library_versions, machine
from grab_exp.validation import check_choice

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
#: what to do about a damaged run file
REMEDY = "overwrite=true starts the run over (the damaged files are kept aside)"
STATUSES = ("running", "finished", "failed", "interrupted")


class LocalStore:
    """``metrics.csv`` and ``summary.json`` of one run directory.

    Args:
        run_dir: The run directory (created on first write).
        columns: The metric columns in file order. ``epoch`` is always the first column: it is
            moved (or added) there.
    """

    def __init__(self, run_dir: str | os.PathLike[str], columns: Sequence[str]) -> None:
        self.run_dir = Path(run_dir)
        self.columns: tuple[str, ...] = ("epoch", *(c for c in columns if c != "epoch"))
        if len(set(self.columns)) != len(self.columns):
            raise ValueError(f"metrics columns must be unique, got {list(columns)}")
        self.metrics_path = self.run_dir / METRICS_FILE
        self.summary_path = self.run_dir / SUMMARY_FILE
        self._header_checked = False

    # ---------------------------------------------------------------- metrics.csv

    def append(self, row: Mapping[str, Any]) -> None:
        """Append one epoch's row, writing the header first if the file is new; flush + fsync.

        Args:
            row: Column name -> value. ``epoch`` is required; missing columns and ``None``
                values become empty cells.

        Raises:
            ValueError: ``row`` has no ``epoch`` or names a column this store does not have, or
                an existing ``metrics.csv`` has a different header, or ``row``'s epoch is not
                the last row's epoch plus 1 (another writer, or a bug).
            DamagedFileError: ``metrics.csv`` cannot be read.
        """
        line = self._format_row(row)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        is_new = self._check_existing_header()
        last = None if is_new else self._last_epoch()
        if last is not None and row["epoch"] != last + 1:
            raise ValueError(
                f"{self.metrics_path}: refusing to append epoch {row['epoch']} after epoch "
                f"{last}; is another job writing this run directory?"
            )
        path = self.metrics_path
        with writing(path), open(path, "a", encoding="utf-8", newline="") as handle:
            handle.write(self._header() + line if is_new else line)
            handle.flush()
            os.fsync(handle.fileno())
        if is_new:
            fsync_dir(self.run_dir)

    def rewrite(self, rows: Iterable[Mapping[str, Any]]) -> None:
        """Atomically replace ``metrics.csv`` with the header and ``rows`` (a resumed run's list).

        The bytes are exactly those that appending the same rows one by one would produce.
        """
        text = self._header() + "".join(self._format_row(row) for row in rows)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.metrics_path, text)
        self._header_checked = True

    def read_metrics(self) -> list[dict[str, Any]]:
        """Return the rows of ``metrics.csv`` ([] if absent); empty cells read as ``None``.

        Raises:
            DamagedFileError: the file is not UTF-8 CSV text.
        """
        try:
            text = self.metrics_path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        except UnicodeDecodeError:
            raise damaged(self.metrics_path, "not UTF-8 text", REMEDY) from None
        try:
            reader = csv.DictReader(io.StringIO(text, newline=""))
            return [{key: _parse_cell(value) for key, value in row.items()} for row in reader]
        except csv.Error as error:
            raise damaged(self.metrics_path, f"not CSV: {error}", REMEDY) from None

    def _last_epoch(self) -> int | None:
        """The last row's epoch in ``metrics.csv`` (``None`` without rows)."""
        rows = self.read_metrics()
        if not rows:
            return None
        last = rows[-1].get("epoch")
        if not isinstance(last, int):
            raise damaged(self.metrics_path, f"its last row's epoch is {last!r}", REMEDY)
        return last

    def _format_row(self, row: Mapping[str, Any]) -> str:
        unknown = sorted(set(row) - set(self.columns))
        if unknown:
            raise ValueError(f"metrics row has unknown columns {unknown}; known: {self.columns}")
        if row.get("epoch") is None:
            raise ValueError("metrics row needs an 'epoch' value")
        return _csv_line([_format_cell(row.get(column)) for column in self.columns])

    def _header(self) -> str:
        return _csv_line(self.columns)

    def _check_existing_header(self) -> bool:
        """Return True if ``metrics.csv`` is missing or empty; else verify its header once."""
        if not self.metrics_path.exists() or self.metrics_path.stat().st_size == 0:
            self._header_checked = True
            return True
        if not self._header_checked:
            try:
                with open(self.metrics_path, encoding="utf-8", newline="") as handle:
                    found = handle.readline()
            except UnicodeDecodeError:
                raise damaged(self.metrics_path, "not UTF-8 text", REMEDY) from None
            if found != self._header():
                raise ValueError(
                    f"{self.metrics_path} has header {found.strip()!r}, expected "
                    f"{self._header().strip()!r}; refusing to append to a different table"
                )
            self._header_checked = True
        return False

    # ---------------------------------------------------------------- summary.json

    def write_summary(self, status: str, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into the previous summary and write it atomically.

        Also stamps ``library_versions``, ``machine`` (CPU model, cores, memory), ``git_commit``
        and ``updated_at`` (UTC, ISO 8601).
        Typical fields: ``final_metrics`` (dict), ``wall_time_s``, ``device``, ``error``.

        Args:
            status: ``running``, ``finished``, ``failed`` or ``interrupted``.
            **fields: Top-level keys to set; a key set to ``None`` is kept as ``null``.

        Returns:
            The summary as written.

        Raises:
            ValueError: ``status`` is not one of :data:`STATUSES`.
        """
        check_choice("summary status", status, STATUSES)
        summary = {"status": status, **(self.read_summary() or {}), **fields}
        summary["status"] = status
        summary["library_versions"] = library_versions()
        summary["machine"] = machine()
        summary["git_commit"] = git_commit()
        summary["updated_at"] = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_json(self.summary_path, summary)
        return summary

    def read_summary(self) -> dict[str, Any] | None:
        """Return the parsed ``summary.json``, or ``None`` when there is none yet.

        Raises:
            DamagedFileError: the file is not a JSON object (the message names it).
        """
        summary = read_json(self.summary_path, REMEDY)
        if summary is not None and not isinstance(summary, dict):
            raise damaged(self.summary_path, "not a JSON object", REMEDY)
        return summary


def _csv_line(cells: Iterable[str]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(list(cells))
    return buffer.getvalue()


def _format_cell(value: Any) -> str:
    """``None`` -> empty cell; tensor/NumPy scalars -> Python numbers; floats round-trip exactly."""
    if value is None:
        return ""
    item = getattr(value, "item", None)
    if callable(item) and not isinstance(value, (int, float, str)):
        value = item()
    return repr(float(value)) if isinstance(value, float) else str(value)


def _parse_cell(text: str | None) -> Any:
    """Inverse of :func:`_format_cell` for numbers: ``int``, then ``float``, else the string."""
    if text is None or text == "":
        return None
    for convert in (int, float):
        try:
            return convert(text)
        except ValueError:
            continue
    return text
