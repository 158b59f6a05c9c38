"""Reading what ``python -m grab_exp`` wrote: run directories, ``metrics.csv`` rows, leftovers."""

from __future__ import annotations

import csv
import io
import time
from pathlib import Path
from typing import Any

METRIC_COLUMNS = [
    "epoch",
    "train/loss",
    "train/acc",
    "test/loss",
    "test/acc",
    "train/running_loss",
    "time/epoch_s",
    "mem/peak_cuda_mb",
    "mem/step_peak_cuda_mb",
    "mem/peak_rss_mb",
    "mem/sorter_bytes",
]
# columns that depend on the machine and the moment, not on the computation
TIMING_COLUMNS = {"time/epoch_s", "mem/peak_cuda_mb", "mem/step_peak_cuda_mb", "mem/peak_rss_mb"}
# files a run writes once its data is loaded (Hydra's own .hydra/ files come earlier)
RUN_ARTIFACTS = ("metrics.csv", "summary.json", "checkpoint.pt")


def run_dirs(cwd: Path) -> list[Path]:
    """Run directories under ``cwd/outputs`` (those with a Hydra config), not kept-aside ones."""
    found = {p.parent.parent for p in (cwd / "outputs").rglob(".hydra/config.yaml")}
    return sorted(d for d in found if ".old" not in d.name)


def run_artifacts(cwd: Path) -> list[Path]:
    """Files under ``cwd`` that only a run that loaded its data writes."""
    return sorted(p for p in cwd.rglob("*") if p.name in RUN_ARTIFACTS)


def read_rows(run_dir: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """``metrics.csv``'s header and rows; numbers parsed, empty cells ``None``."""
    return parse_rows((run_dir / "metrics.csv").read_text(encoding="utf-8"))


def parse_rows(text: str) -> tuple[list[str], list[dict[str, Any]]]:
    """Header and rows of a ``metrics.csv`` text (see :func:`read_rows`)."""
    reader = csv.DictReader(io.StringIO(text, newline=""))
    rows = [{k: _number(v) for k, v in row.items()} for row in reader]
    return list(reader.fieldnames or []), rows


def _number(text: str) -> Any:
    if text == "":
        return None
    try:
        return int(text)
    except ValueError:
        return float(text)


def computed(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows without the timing and memory columns (what must repeat exactly)."""
    return [{k: v for k, v in row.items() if k not in TIMING_COLUMNS} for row in rows]


def temp_files(root: Path) -> list[Path]:
    """Leftovers of the atomic writers (``.<name>.<random>.tmp``) under ``root``."""
    return sorted(p for p in root.rglob("*") if p.is_file() and p.name.endswith(".tmp"))


def wait_for(predicate, timeout: float, what: str, job=None):
    """Poll ``predicate`` every 20 ms until it is truthy; fail after ``timeout`` seconds.

    ``job`` (a :class:`support.grab_run.Job`): fail at once if its process ends first.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if job is not None and job.process.poll() is not None:
            raise AssertionError(f"the run ended ({job.process.returncode}) before {what}")
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
