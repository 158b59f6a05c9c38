"""Idle-machine step times of Table 1's rows from ``python -m grab_exp.bench epoch``'s JSON.

The report's time overheads come only from this benchmark (every row timed in one process,
interleaved, medians), never from the jobs' own ``time/epoch_s``, which on a shared machine mostly
show its load.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from grab_exp.logging.files import shown
from grab_exp.report.variants import ROW_ORDER, row_key


@dataclass
class EpochBench:
    """Per-row idle-machine times: ``variant``, ``pipeline``, ``step_ms``, ``epoch_s``."""

    times: pd.DataFrame
    source: str  # the JSON file, as the report's captions name it


def read_epoch_bench(path: str | os.PathLike[str], name: str | None = None) -> EpochBench:
    """The Table 1 rows of an ``epoch`` benchmark JSON (its VRGD rows are left out).

    ``name`` is how captions cite the file (default: ``path`` relative to the working directory).

    Raises:
        ValueError: not an ``epoch`` benchmark, or without Table 1's rows.
    """
    data = json.loads(Path(path).read_text())
    if data.get("benchmark") != "epoch":
        raise ValueError(f"{path}: not a `python -m grab_exp.bench epoch` file")
    keys = {row_key(*row): row for row in ROW_ORDER}
    rows = [
        {"variant": keys[r["row"]][0], "pipeline": keys[r["row"]][1],
         "step_ms": float(r["step_ms"]), "epoch_s": float(r["epoch_s"])}
        for r in data["rows"] if r["row"] in keys
    ]  # fmt: skip
    if not rows:
        raise ValueError(f"{path}: no Table 1 row ({', '.join(keys)})")
    return EpochBench(pd.DataFrame(rows), name or shown(path))
