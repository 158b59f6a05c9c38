"""Run-directory states: finished (skip), interrupted (resume), or start over (keep aside)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path
from typing import Any

from grab_exp.logging.files import DamagedFileError, shown
from grab_exp.logging.local import LocalStore

log = logging.getLogger("grab_exp")
RUN_ARTIFACTS = ("metrics.csv", "summary.json", "checkpoint.pt", "wandb")


def has_artifacts(run_dir: Path) -> bool:
    """Whether an earlier run left anything in ``run_dir``."""
    return any((run_dir / name).exists() for name in RUN_ARTIFACTS)


def keep_aside(run_dir: Path) -> Path:
    """Move an earlier run's files into ``<run_dir>.old<k>`` (first free k); never delete.

    The Hydra config folder is copied along so the old run stays self-describing.
    """
    k = 1
    while (aside := run_dir.with_name(f"{run_dir.name}.old{k}")).exists():
        k += 1
    aside.mkdir(parents=True)
    for name in RUN_ARTIFACTS:
        if (run_dir / name).exists():
            shutil.move(str(run_dir / name), aside / name)
    if (run_dir / ".hydra").exists():
        shutil.copytree(run_dir / ".hydra", aside / ".hydra")
    log.info("overwrite=true: the earlier run in %s was moved to %s", run_dir, aside)
    return aside


def _finished_summary(run_dir: Path) -> dict[str, Any] | None:
    previous = LocalStore(run_dir, ("epoch",)).read_summary()
    return previous if previous and previous.get("status") == "finished" else None


def will_skip(run_dir: str | Path, overwrite: bool) -> bool:
    """Whether the job in ``run_dir`` will be skipped: it finished and ``overwrite`` is off.

    A damaged ``summary.json`` counts as "not skipped": the job itself then reports it.
    """
    if overwrite:
        return False
    try:
        return _finished_summary(Path(run_dir)) is not None
    except DamagedFileError:
        return False


def finished_run(run_dir: Path, overwrite: bool) -> dict[str, Any] | None:
    """The final metrics of a run that already finished in ``run_dir`` (to skip it), else None.

    With ``overwrite`` a finished run is not skipped, and its summary is not even read (a
    damaged one is kept aside with the rest).

    Raises:
        DamagedFileError: ``summary.json`` cannot be read (without ``overwrite``).
    """
    if overwrite:
        return None
    summary = _finished_summary(run_dir)
    if summary is None:
        return None
    log.info(
        "run directory: %s (skipped: it already finished; overwrite=true starts it over)",
        shown(run_dir),
    )
    return summary.get("final", {})
