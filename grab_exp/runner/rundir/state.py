"""Run-directory states: finished (skip), interrupted (resume), or start over (keep aside)."""

from __future__ import annotations

import contextlib
import logging
import shutil
from pathlib import Path
from typing import Any

from grab_exp.logging.files import DamagedFileError, shown
from grab_exp.logging.local import SUMMARY_FILE, LocalStore
from grab_exp.runner.config.fingerprint import check_same_config

log = logging.getLogger("grab_exp")
RUN_ARTIFACTS = ("metrics.csv", "summary.json", "checkpoint.pt", "wandb")


#: the job's log in its run directory (Hydra's ``${hydra.job.name}.log``), appended to by every
#: job of the directory
JOB_LOG = "__main__.log"
_earlier_log_bytes: dict[str, int] = {}


def mark_job_log_start(run_dir: str | Path) -> None:
    """Remember how much of ``run_dir``'s job log earlier jobs wrote, before this job's first
    line (:func:`keep_aside` moves those lines along with the earlier run)."""
    path = Path(run_dir) / JOB_LOG
    _earlier_log_bytes[str(path)] = path.stat().st_size if path.is_file() else 0


#: what Hydra and the job write into a run directory before the run starts
JOB_STUB = (".hydra/config.yaml", ".hydra/hydra.yaml", ".hydra/overrides.yaml", JOB_LOG, ".lock")


def remove_refused_job(run_dir: str | Path) -> None:
    """Remove what a job refused before its run started left in ``run_dir`` (Hydra's
    ``.hydra/``, the job log, the lock file), then ``run_dir`` and its parents up to the working
    folder as far as they are empty; nothing when ``run_dir`` held anything before this job
    (an earlier run, or lines of an earlier job in its log)."""
    run_dir = Path(run_dir).absolute()
    earlier = _earlier_log_bytes.get(str(run_dir / JOB_LOG), 0)
    if earlier or has_artifacts(run_dir):
        return
    for name in JOB_STUB:
        (run_dir / name).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        (run_dir / ".hydra").rmdir()
    cwd, folder = Path.cwd(), run_dir
    while folder != cwd and (folder == run_dir or folder.is_relative_to(cwd)):
        try:
            folder.rmdir()
        except OSError:  # not empty (a file of the user's, another run's folder), or gone
            return
        folder = folder.parent


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
    _split_job_log(run_dir / JOB_LOG, aside / JOB_LOG)
    log.info("overwrite=true: the earlier run in %s was moved to %s", run_dir, aside)
    return aside


def _split_job_log(path: Path, aside: Path) -> None:
    """Move the earlier jobs' lines of the job log (:func:`mark_job_log_start`) to ``aside``;
    this job's own lines stay (its open handler appends after them)."""
    earlier = _earlier_log_bytes.get(str(path), 0)
    if not earlier or not path.is_file():
        return
    with path.open("r+b") as log_file:
        text = log_file.read()
        aside.write_bytes(text[:earlier])
        log_file.seek(0)
        log_file.write(text[earlier:])
        log_file.truncate()
    _earlier_log_bytes[str(path)] = 0


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


def check_run_dir_config(
    run_dir: Path, overwrite: bool, config: dict[str, Any], say_unknown: bool = True
) -> None:
    """Refuse a run directory whose earlier run recorded another config (see
    :mod:`grab_exp.runner.config.fingerprint`); with ``say_unknown``, log it when it recorded
    none. With ``overwrite`` there is no earlier run to compare with.

    Raises:
        ConfigDriftError: the earlier run's config differs from ``config``.
        DamagedFileError: ``summary.json`` cannot be read (without ``overwrite``).
    """
    summary = None if overwrite else LocalStore(run_dir, ("epoch",)).read_summary()
    known = summary is not None and "config_fingerprint" in summary
    if summary is not None and (known or say_unknown):
        recorded = summary["config_fingerprint"]["config"] if known else None
        check_same_config(run_dir, recorded, config, SUMMARY_FILE)


def finished_run(run_dir: Path, overwrite: bool, config: dict[str, Any]) -> dict[str, Any] | None:
    """The final metrics of a run that already finished in ``run_dir`` (to skip it), else None.

    With ``overwrite`` a finished run is not skipped, and its summary is not even read (a
    damaged one is kept aside with the rest). Without, the earlier run (finished or not) must
    have run ``config`` (the flat composed config).

    Raises:
        DamagedFileError: ``summary.json`` cannot be read (without ``overwrite``).
        ConfigDriftError: the earlier run recorded another config.
    """
    check_run_dir_config(run_dir, overwrite, config)
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
