"""The idle-machine benchmark files Table 1 reads: an ``epoch`` bench's step times (the only source
of time overheads) and a ``state`` bench's training-state bytes (the memory column), each with
the machine and commit that wrote it."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from grab_exp.logging.files import shown
from grab_exp.report.table1_rows import ROW_ORDER
from grab_exp.runner.rundir.resolvers import variant_dir


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
    method: str | None = None,
) -> BenchRows:
    """Table 1's rows of a ``python -m grab_exp.bench <benchmark>`` JSON.

    Args:
        path: The JSON file.
        benchmark: The benchmark that must have written it.
        columns: Column name -> its value from a row of the file.
        name: How captions cite the file (default: ``path`` relative to the working directory).
        method: The per-sample method the runs used, when not the file's default: its
            ``<row>@<method>`` rows (``rr@hooks``...) stand for the per-sample rows.

    Raises:
        ValueError: not a ``benchmark`` file, without Table 1's rows, or without a per-sample
            row's ``@method`` twin.
    """
    data = json.loads(Path(path).read_text())
    if data.get("benchmark") != benchmark:
        raise ValueError(f"{path}: not a `python -m grab_exp.bench {benchmark}` file")
    keys = {variant_dir(*row): row for row in ROW_ORDER}  # the rows' run directory names
    if method:
        keys = _method_keys(data["rows"], keys, method, path)
    rows = [
        {"variant": keys[r["row"]][0], "pipeline": keys[r["row"]][1],
         **{column: value(r) for column, value in columns.items()}}
        for r in data["rows"] if r["row"] in keys
    ]  # fmt: skip
    if not rows:
        raise ValueError(f"{path}: no Table 1 row ({', '.join(keys)})")
    source = name or shown(path)
    return BenchRows(
        pd.DataFrame(rows), f"{source}, its @{method} rows" if method else source,
        data.get("machine", {}),
    )  # fmt: skip


def _method_keys(
    rows: list[dict], keys: dict[str, tuple[str, str]], method: str, path
) -> dict[str, tuple[str, str]]:
    """Bench row name -> Table 1 row, each per-sample row's ``<row>@<method>`` twin for it."""
    named = {r["row"] for r in rows}
    twins = {key if row[1] == "classic" else f"{key}@{method}": row for key, row in keys.items()}
    missing = [twin for twin in twins if twin not in named]
    if missing:
        raise ValueError(f"{path}: no rows {', '.join(missing)} for --bench-method {method}")
    return twins


def read_epoch_bench(
    path: str | os.PathLike[str], name: str | None = None, method: str | None = None
) -> BenchRows:
    """The Table 1 rows of an ``epoch`` benchmark JSON (its VRGD rows are left out).

    ``name`` is how captions cite the file (default: ``path`` relative to the working
    directory); ``method``: read the per-sample rows' ``@method`` twins (:func:`read_bench_rows`).

    Raises:
        ValueError: not an ``epoch`` benchmark, or without Table 1's rows.
    """
    columns = {"step_ms": lambda r: float(r["step_ms"]), "epoch_s": lambda r: float(r["epoch_s"])}
    return read_bench_rows(path, "epoch", columns, name, method)


def read_training_state(path: str | os.PathLike[str], name: str | None = None) -> BenchRows:
    """The Table 1 rows of a ``state`` benchmark JSON (``python -m grab_exp.bench state``):
    ``state_mb``, the MiB allocated for model, gradients, optimizer, per-sample buffer, ordering
    state and the step's peak.

    ``name`` is how captions cite the file (default: ``path`` relative to the working directory).

    Raises:
        ValueError: not a ``state`` benchmark, or without Table 1's rows.
    """
    return read_bench_rows(path, "state", {"state_mb": lambda r: r["total"] / 2**20}, name)
