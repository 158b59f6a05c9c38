"""Checks before Hydra creates anything: one job, or each job of a sweep.

:func:`check_job` is every check a job passes before its run directory, its ``.hydra/`` folder
or its log exist: the config's values (:func:`validate_config`, the one validator), then its run
directory (not held by a live job, no earlier run of another config). Hydra calls
:class:`ValidateFirst` (``conf/config.yaml``'s ``hydra.callbacks``) for a single run before it
writes anything; a sweep's :class:`~grab_exp.runner.launch.sweeper.Sweeper` checks each job
before it launches any. The job's fingerprint is kept
(:func:`~grab_exp.runner.config.check.take_checked`) for
:func:`~grab_exp.runner.training.job.run_job`, which validates only a job that nothing checked
(a caller outside Hydra's command line, a job that SLURM or a plugin's launcher runs elsewhere)
and checks the directory again under its lock.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig

from grab_exp.logging.files import DamagedFileError
from grab_exp.runner.config.check import keep_checked, validate_config
from grab_exp.runner.config.fingerprint import config_fingerprint
from grab_exp.runner.config.schema import ConfigError
from grab_exp.runner.rundir.lock import RunDirInUseError, check_free
from grab_exp.runner.rundir.state import check_run_dir_config


@contextlib.contextmanager
def hydra_config_of(config: DictConfig) -> Iterator[None]:
    """``${hydra:...}`` resolves against ``config`` inside the block, as in Hydra's run_job."""
    hydra = HydraConfig.instance()
    previous = hydra.cfg
    hydra.set_config(config)
    try:
        yield
    finally:
        hydra.cfg = previous


def run_dir_of(config: DictConfig) -> Path:
    """The run directory Hydra will create for ``config`` (a single run's, or a sweep job's)."""
    with hydra_config_of(config):
        if config.hydra.mode == RunMode.MULTIRUN:
            return Path(config.hydra.sweep.dir, str(config.hydra.sweep.subdir)).absolute()
        return Path(config.hydra.run.dir).absolute()


def dir_setting(config: DictConfig) -> str:
    """The setting that places ``config``'s run directory: ``hydra.run.dir`` or
    ``hydra.sweep.dir``."""
    return "hydra.sweep.dir" if config.hydra.mode == RunMode.MULTIRUN else "hydra.run.dir"


def check_writable(folder: Path, setting: str) -> None:
    """``folder`` is, or can be made, a folder this process writes into; nothing remains of the
    check (a temporary folder made and removed in its nearest existing parent).

    Raises:
        ConfigError: one line naming ``folder``, why, and ``setting``.
    """
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir():
        try:
            os.rmdir(tempfile.mkdtemp(prefix=".grab-write-check-", dir=existing))
            return
        except OSError as error:
            reason = error.strerror or error
            if existing == folder:
                why = f"cannot write the folder {folder} ({reason})"
            else:  # its nearest existing parent takes no new folder (/proc)
                why = f"cannot create the folder {folder} ({reason})"
    else:
        why = f"cannot write the folder {folder}: {existing} is a file, not a folder"
    raise ConfigError(f"{setting}: {why}; allowed: a folder you can write ({setting}=PATH)")


#: what :func:`check_job` refuses a job with, each one line for users
JOB_ERRORS = (ConfigError, RunDirInUseError, DamagedFileError)


def check_job(config: DictConfig) -> dict[str, Any]:
    """Check a composed job config: its values first, then its run directory (not writable,
    held by a live job, an unreadable summary, or an earlier run of another config there).

    Returns:
        The job's fingerprint, which the job's process keeps for
        :func:`~grab_exp.runner.config.check.take_checked` (:class:`ValidateFirst`, the sweep's
        :class:`~grab_exp.runner.launch.sweeper.CheckedJobs`).

    Raises:
        ConfigError, RunDirInUseError, DamagedFileError: one line (:data:`JOB_ERRORS`).
    """
    run_dir = run_dir_of(config)
    with hydra_config_of(config):
        validate_config(config)
        fingerprint = config_fingerprint(config)
    check_writable(run_dir, dir_setting(config))
    check_free(run_dir)
    check_run_dir_config(run_dir, config.overwrite, fingerprint["config"], say_unknown=False)
    return fingerprint


class ValidateFirst(Callback):
    """Reject a bad single run before anything is written or trained."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """One job: its problem as the one ``error: ...`` line, exit status 1."""
        try:
            fingerprint = check_job(config)
        except JOB_ERRORS as error:
            sys.exit(f"error: {error}")
        keep_checked(run_dir_of(config), config.hydra.overrides.task, fingerprint)
