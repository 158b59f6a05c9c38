"""Helpers for the runner tests: ``python -m grab_exp`` in real subprocesses, and its run dirs.

Every command runs with ``cwd`` set to a temporary folder (Hydra writes ``outputs/`` there) and
W&B forced offline with all its folders in that temporary folder and no API key.
"""

from __future__ import annotations

import csv
import io
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

GRAB = [sys.executable, "-m", "grab_exp"]
METRIC_COLUMNS = [
    "epoch",
    "train/loss",
    "train/acc",
    "test/loss",
    "test/acc",
    "train/running_loss",
    "time/epoch_s",
    "mem/peak_cuda_mb",
    "mem/peak_rss_mb",
    "mem/sorter_bytes",
]
# columns that depend on the machine and the moment, not on the computation
TIMING_COLUMNS = {"time/epoch_s", "mem/peak_cuda_mb", "mem/peak_rss_mb"}
SMOKE = ["experiment=smoke", "progress=line"]
RUN_TIMEOUT_S = 240


def grab_env(root: Path, **extra: str) -> dict[str, str]:
    """The environment of a ``python -m grab_exp`` subprocess: W&B offline, quiet, in ``root``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    for name in ("wandb_dir", "wandb_config", "wandb_cache", "wandb_data"):
        (root / name).mkdir(parents=True, exist_ok=True)
    env.update(
        WANDB_MODE="offline",
        WANDB_SILENT="true",
        WANDB_ERROR_REPORTING="false",
        WANDB_DIR=str(root / "wandb_dir"),
        WANDB_CONFIG_DIR=str(root / "wandb_config"),
        WANDB_CACHE_DIR=str(root / "wandb_cache"),
        WANDB_DATA_DIR=str(root / "wandb_data"),
        NETRC=str(root / "no-netrc"),  # no W&B API key from the user's ~/.netrc
        OMP_NUM_THREADS="1",  # runs in parallel on a small CPU without oversubscription
        HYDRA_FULL_ERROR="0",
    )
    env.update(extra)
    return env


def run_grab(
    args: list[str], cwd: Path, env: dict[str, str], timeout: float = RUN_TIMEOUT_S
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m grab_exp *args`` to the end; stdout and stderr together in ``.stdout``."""
    return subprocess.run(
        [*GRAB, *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )


class Job:
    """A ``python -m grab_exp`` process started in the background; output in ``cwd/<log>``."""

    def __init__(self, args: list[str], cwd: Path, env: dict[str, str], log: str = "grab.log"):
        self.log_path = cwd / log
        with open(self.log_path, "w", encoding="utf-8") as handle:
            self.process = subprocess.Popen(
                [*GRAB, *args], cwd=cwd, env=env, stdout=handle, stderr=subprocess.STDOUT
            )

    @property
    def pid(self) -> int:
        return self.process.pid

    def finish(self, timeout: float = RUN_TIMEOUT_S) -> tuple[int, str]:
        """Wait for the process (killing it after ``timeout``); return (exit status, output)."""
        try:
            self.process.wait(timeout=timeout)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
        return self.process.returncode, self.log_path.read_text(encoding="utf-8")


def run_dirs(cwd: Path) -> list[Path]:
    """Run directories under ``cwd/outputs`` (those with a Hydra config), not kept-aside ones."""
    found = {p.parent.parent for p in (cwd / "outputs").rglob(".hydra/config.yaml")}
    return sorted(d for d in found if ".old" not in d.name)


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


def wait_for(predicate, timeout: float, what: str, job: Job | None = None):
    """Poll ``predicate`` every 20 ms until it is truthy; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        if job is not None and job.process.poll() is not None:
            raise AssertionError(f"the run ended ({job.process.returncode}) before {what}")
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")
