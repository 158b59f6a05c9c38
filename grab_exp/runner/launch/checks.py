"""Checks before Hydra creates anything: one job, or each job of a sweep.

:func:`job_problem` is every check a job passes before its run directory, its ``.hydra/``
folder or its log exist: the config's values (:func:`validate_config`, the one validator), then
its run directory (not held by a live job, no earlier run of another config). Hydra calls
:class:`ValidateFirst` (registered in ``conf/config.yaml``, ``hydra.callbacks``) for a single
run after composing its config and before it writes anything; a sweep's
:class:`~grab_exp.runner.launch.sweeper.Sweeper` runs :func:`job_problem` on each job before it
launches any. A job checked so in the process that runs it is checked once: its fingerprint is kept
(:func:`~grab_exp.runner.config.check.take_checked`) for
:func:`~grab_exp.runner.training.job.run_job`, which validates only a job that nothing checked in
its process (a caller outside Hydra's command line, a joblib worker) and checks the directory under
its lock.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

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


def job_problem(config: DictConfig) -> str | None:
    """The one-line reason a composed job config cannot run, or ``None`` when it can.

    Its values first, then its run directory: held by a live job, an unreadable summary, or an
    earlier run of another config there. A job that can run keeps its fingerprint for
    :func:`~grab_exp.runner.config.check.take_checked`.
    """
    run_dir = run_dir_of(config)
    try:
        with hydra_config_of(config):
            validate_config(config)
            fingerprint = config_fingerprint(config)
        check_free(run_dir)
        check_run_dir_config(run_dir, config.overwrite, fingerprint["config"], say_unknown=False)
    except (ConfigError, RunDirInUseError, DamagedFileError) as error:
        return str(error)
    keep_checked(run_dir, config.hydra.overrides.task, fingerprint)
    return None


def sweep_jobs(config: DictConfig) -> list[list[str]]:
    """Every job's overrides of a basic-sweeper multirun, in Hydra's job order."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper

    params = config.hydra.sweeper.get("params")
    params = OmegaConf.to_container(params) if params else {}
    arguments = [f"{key}={value}" for key, value in params.items()]
    arguments += list(config.hydra.overrides.task)
    overrides = OverridesParser.create().parse_overrides(arguments)
    return [job for batch in BasicSweeper.split_arguments(overrides, None) for job in batch]


class ValidateFirst(Callback):
    """Reject a bad single run before anything is written or trained."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """One job: its problem as the one ``error: ...`` line, exit status 1."""
        if problem := job_problem(config):
            sys.exit(f"error: {problem}")
