"""``hydra/launcher=joblib_local``: the joblib plugin's launcher, made to stop with its sweep.

Each worker process leaves the terminal's process group when it takes its first job, so a
Ctrl-C or a signal to the group reaches only the sweep's own process, which relays it to every
worker once (:class:`~grab_exp.runner.sweeper.SweepStop`). A worker remembers a stop signal for
its whole life (:func:`~grab_exp.runner.signals.latch_stop_signals`): its running job stops at
the next step boundary, and no job queued behind it starts (nor gets a directory).
"""

from __future__ import annotations

import logging
import os
import signal
from collections.abc import Sequence
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, setup_globals
from hydra_plugins.hydra_joblib_launcher._core import execute_job as plugin_execute_job
from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from joblib import Parallel, delayed

from grab_exp.runner.signals import latch_stop_signals, stop_received
from grab_exp.runner.sweeper import STOP, not_started, outcome_of

log = logging.getLogger("grab_exp")


class _Worker:
    """Set up once per joblib worker process: its own process group, stop signals latched."""

    ready = False

    @classmethod
    def join(cls) -> None:
        if not cls.ready:
            os.setpgrp()  # a terminal's Ctrl-C or a group kill reaches the sweeper, which relays
            latch_stop_signals()
            cls.ready = True


def execute_job(idx: int, overrides: Sequence[str], *args: Any) -> JobReturn:
    """The joblib plugin's ``execute_job`` in a worker, unless the sweep stopped before."""
    _Worker.join()
    if (signum := stop_received()) is not None:
        return not_started(overrides, signum)
    return plugin_execute_job(idx, overrides, *args)


class JoblibLocalLauncher(JoblibLauncher):
    """The joblib plugin's launcher whose workers stop with the sweep and start no queued job.

    Results come back as jobs end, so a failure with ``fail_fast`` stops the rest at once.
    """

    fail_fast = False
    stops_with_sweep = True  # the sweeper relays SIGTERM and SIGINT to its workers

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        """Run the jobs in joblib's workers; returns their ``JobReturn`` in job order."""
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        joblib_cfg = dict(self.joblib, backend="loky")  # as the plugin: loky only
        process_joblib_cfg(joblib_cfg)
        log.info("launching %d jobs in %s joblib workers", len(job_overrides), joblib_cfg["n_jobs"])
        state = Singleton.get_state()
        tasks = (
            delayed(_numbered)(idx, initial_job_idx + idx, overrides, *self._task(), state)
            for idx, overrides in enumerate(job_overrides)
        )
        returns: dict[int, JobReturn] = {}
        for idx, ret in Parallel(**joblib_cfg, return_as="generator_unordered")(tasks):
            returns[idx] = ret
            if self.fail_fast and outcome_of(ret)[0] == "failed":
                STOP.request(signal.SIGTERM, "fail_fast")
        return [returns[idx] for idx in range(len(job_overrides))]

    def _task(self) -> tuple:
        return self.hydra_context, self.config, self.task_function


def _numbered(idx: int, number: int, overrides: Sequence[str], *args: Any) -> tuple:
    return idx, execute_job(number, overrides, *args)
