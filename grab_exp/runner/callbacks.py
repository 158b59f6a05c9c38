"""Validation before Hydra creates anything: one job, or every job of a sweep at once.

:class:`ValidateFirst` is registered in ``conf/config.yaml`` (``hydra.callbacks``). Hydra calls
``on_run_start`` / ``on_multirun_start`` after composing the config and before it creates a run
directory or launches a job, so a rejected config leaves nothing on disk, and a sweep with one
bad job trains none. The task's own :func:`~grab_exp.runner.lifecycle.run_job` validates again
(cheap), for callers that do not go through Hydra's command line.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from grab_exp.runner.config_check import validate_config
from grab_exp.runner.lock import RunDirInUseError, check_free
from grab_exp.runner.schema import ConfigError

BASIC_SWEEPER = "hydra._internal.core_plugins.basic_sweeper.BasicSweeper"


def _problem(cfg: DictConfig) -> str | None:
    """The one-line validation error of a composed config, or ``None`` when it can run."""
    try:
        validate_config(cfg)
    except ConfigError as error:
        return str(error)
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


def sweep_problems(config: DictConfig) -> list[str]:
    """``job <k> (<overrides>): <error>`` for every job of the sweep that cannot run."""
    loader = GlobalHydra.instance().config_loader()
    problems = []
    for number, overrides in enumerate(sweep_jobs(config)):
        try:
            problem = _problem(loader.load_sweep_config(config, list(overrides)))
        except (HydraException, OmegaConfBaseException) as error:
            problem = "; ".join(str(error).strip().splitlines()[:2])
        if problem:
            problems.append(f"job {number} ({' '.join(overrides)}): {problem}")
    return problems


class ValidateFirst(Callback):
    """Reject a bad run, or a sweep with any bad job, before anything is written or trained."""

    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """One job: its error as the one ``error: ...`` line, exit status 1; also a run
        directory in use, before Hydra writes its files there."""
        if problem := _problem(config):
            sys.exit(f"error: {problem}")
        HydraConfig.instance().set_config(config)  # as Hydra's run_job does, to resolve the dir
        try:
            check_free(Path(config.hydra.run.dir).absolute())
        except RunDirInUseError as error:
            sys.exit(f"error: {error}")

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A sweep: compose and validate every job; list every error, exit 1 if any."""
        if config.hydra.sweeper._target_ != BASIC_SWEEPER:
            return  # other sweepers choose their jobs as they go: each job validates itself
        problems = sweep_problems(config)
        if problems:
            total = len(sweep_jobs(config))
            head = f"error: {len(problems)} of {total} jobs of this sweep cannot run; none started"
            sys.exit("\n".join([head, *(f"  {line}" for line in problems)]))
