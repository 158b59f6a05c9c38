"""``hydra/launcher=joblib_local``: the joblib plugin's launcher, made to stop with its sweep.

Each worker process leaves the terminal's process group when it takes its first job, so a Ctrl-C or
a signal to the group reaches only the sweep's own process, which relays it to every worker once
(:class:`~grab_exp.runner.launch.sweeper.SweepStop`). A worker remembers a stop signal for its whole
life (:func:`~grab_exp.runner.training.signals.latch_stop_signals`): its running job stops at the
next step boundary, and no job queued behind it starts (nor gets a directory). A worker also stops
when the sweep's process dies (a SIGKILL after a time limit's SIGINT): within a second it sends
itself SIGTERM, its job stops the same way, and the worker exits instead of training on, holding a
GPU, outside every process group.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, configure_log, setup_globals
from hydra.types import HydraContext
from hydra_plugins.hydra_joblib_launcher._core import execute_job as plugin_execute_job
from hydra_plugins.hydra_joblib_launcher._core import process_joblib_cfg
from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
from joblib import Parallel, delayed

from grab_exp.runner.launch.sweeper import STOP, CheckedJobs, not_started, outcome_of
from grab_exp.runner.training.signals import latch_stop_signals, stop_received

log = logging.getLogger("grab_exp")


class _Worker:
    """Set up once per joblib worker process: its own process group, stop signals latched, and
    a watch on the sweep's process."""

    ready = False
    parent = 0  # the sweep's process
    running = False  # a job runs in this worker now

    @classmethod
    def join(cls) -> None:
        if not cls.ready:
            os.setpgrp()  # a terminal's Ctrl-C or a group kill reaches the sweeper, which relays
            latch_stop_signals()
            cls.parent = os.getppid()
            threading.Thread(target=cls._watch, name="grab_exp-sweep-watch", daemon=True).start()
            cls.ready = True

    @classmethod
    def _watch(cls, every_s: float = 1.0) -> None:
        """Once the sweep's process is gone (this worker was re-parented): SIGTERM to itself, so
        a running job stops at its next step boundary, then exit when no job runs. (The kernel's
        ``PR_SET_PDEATHSIG`` fires when the thread that forked the worker ends, which in
        joblib's executor is not the sweep's end.)"""
        while os.getppid() == cls.parent:
            time.sleep(every_s)
        os.kill(os.getpid(), signal.SIGTERM)
        while cls.running:
            time.sleep(every_s)
        cls.leave_if_orphaned()

    @classmethod
    def leave_if_orphaned(cls) -> None:
        """Exit once the sweep's process died: no one is left to report to (joblib's worker
        would otherwise wait for work that never comes)."""
        if os.getppid() != cls.parent:
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(OSError, ValueError):
                    stream.flush()
            os._exit(128 + (stop_received() or signal.SIGTERM))


def execute_job(idx: int, overrides: Sequence[str], *args: Any) -> JobReturn:
    """The joblib plugin's ``execute_job`` in a worker, unless the sweep stopped before."""
    _Worker.join()
    if (signum := stop_received()) is not None:
        return not_started(overrides, signum)
    _Worker.running = True
    try:
        return plugin_execute_job(idx, overrides, *args)
    finally:
        _Worker.running = False
        _Worker.leave_if_orphaned()


class JoblibLocalLauncher(JoblibLauncher):
    """The joblib plugin's launcher whose workers stop with the sweep and start no queued job.

    Results come back as jobs end, so a failure with ``fail_fast`` stops the rest at once.
    """

    fail_fast = False
    stops_with_sweep = True  # the sweeper relays SIGTERM and SIGINT to its workers
    takes_checked = True  # each task carries its job's checked config (the sweeper's CheckedJobs)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> list:
        """Run the jobs in joblib's workers; returns their ``JobReturn`` in job order."""
        setup_globals()
        configure_log(self.config.hydra.hydra_logging, self.config.hydra.verbose)
        joblib_cfg = dict(self.joblib, backend="loky")  # as the plugin: loky only
        process_joblib_cfg(joblib_cfg)
        log.info("launching %d jobs in %s joblib workers", len(job_overrides), joblib_cfg["n_jobs"])
        state = Singleton.get_state()
        tasks = (
            delayed(_numbered)(idx, initial_job_idx + idx, overrides, *self._task(overrides), state)
            for idx, overrides in enumerate(job_overrides)
        )
        returns: dict[int, JobReturn] = {}
        for idx, ret in Parallel(**joblib_cfg, return_as="generator_unordered")(tasks):
            returns[idx] = ret
            if self.fail_fast and outcome_of(ret)[0] == "failed":
                STOP.request(signal.SIGTERM, "fail_fast")
        return [returns[idx] for idx in range(len(job_overrides))]

    def _task(self, overrides: Sequence[str]) -> tuple:
        """What a worker runs the job with: Hydra's context carries only this job's check."""
        loader = self.hydra_context.config_loader
        if isinstance(loader, CheckedJobs):
            loader = loader.only(overrides)
        context = HydraContext(config_loader=loader, callbacks=self.hydra_context.callbacks)
        return context, self.config, self.task_function


def _numbered(idx: int, number: int, overrides: Sequence[str], *args: Any) -> tuple:
    return idx, execute_job(number, overrides, *args)
