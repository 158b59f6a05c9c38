"""Sweeps (``-m``) that finish what they can, stop when told, and end with one line per job.

:class:`Sweeper` (``hydra/sweeper=grab``, the default of ``conf/config.yaml``) is Hydra's basic
sweeper (same jobs, same order, ``hydra.sweeper.params`` included) plus three things:

* **Every job is checked before any starts** (:func:`~grab_exp.runner.launch.checks.check_job`):
  one job that cannot run (an invalid value) starts none; the sweep exits 1 with one line per
  such job and writes nothing. With ``hydra.sweeper.fail_fast=true`` the first failed job also
  stops the sweep. A local launcher trains each job on the config the check composed and on its
  check (:class:`CheckedJobs`): a job is composed and validated once.
* **A failed job does not stop its siblings**: each job reports its end to the sweeper (its
  error line, or that it was interrupted) instead of ending the process.
* **SIGTERM or SIGINT stop the whole sweep**: the sweeper relays the signal to the running
  jobs (each stops at its next step boundary, ``interrupted``), starts no queued job, and exits
  128 + the signal with one line.

With the basic launcher the jobs run one after another in this process; with
:class:`JoblibLocalLauncher` (``hydra/launcher=joblib_local``) in joblib's worker processes,
which leave the terminal's process group: a signal reaches them once, through the sweeper.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import DictConfig, OmegaConf

from grab_exp.runner.config.check import keep_checked
from grab_exp.runner.config.schema import ConfigError
from grab_exp.runner.launch.checks import JOB_ERRORS, check_job, check_writable, run_dir_of
from grab_exp.runner.training.errors import JobEndError, error_record
from grab_exp.runner.training.signals import STOP_SIGNALS

log = logging.getLogger("grab_exp")


@dataclass
class SweepStop:
    """Whether the sweep was told to stop (the first signal's number), shared with the launcher."""

    signum: int | None = None
    reason: str = ""
    relayed: list[int] = field(default_factory=list)

    def note(self, signum: int, reason: str = "") -> None:
        """Remember that the sweep stops, on ``signum`` (for ``reason``: its name by default)."""
        if self.signum is None:
            self.signum, self.reason = signum, reason or signal.Signals(signum).name

    def request(self, signum: int, reason: str = "") -> None:
        """Stop the sweep: remember why, relay ``signum`` to every worker process."""
        self.note(signum, reason)
        for child in multiprocessing.active_children():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)
                self.relayed.append(child.pid)


STOP = SweepStop()


@contextlib.contextmanager
def relay_stop_signals() -> Iterator[SweepStop]:
    """While the sweep runs: SIGTERM and SIGINT stop it (see :class:`SweepStop`)."""
    STOP.__init__()

    def relay(signum: int, frame: object) -> None:
        STOP.request(signum)

    previous = {signum: signal.signal(signum, relay) for signum in STOP_SIGNALS}
    try:
        yield STOP
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


@dataclass
class Outcome:
    """How one job of the sweep ended."""

    number: int
    overrides: list[str]
    run_dir: str
    kind: str  # finished | failed | interrupted | not started
    line: str = ""

    def describe(self) -> str:
        """``job <k> (<overrides>) in <dir>``."""
        return f"job {self.number} ({' '.join(self.overrides)}) in {self.run_dir}"


def outcome_of(ret: JobReturn) -> tuple[str, str]:
    """``(kind, line)`` of a job's return: finished, or how it ended and its one line."""
    if ret.status == JobStatus.COMPLETED:
        return "finished", ""
    value = ret._return_value
    if isinstance(value, JobEndError):
        return value.kind, value.line
    return "failed", error_record(value)["message"] if value is not None else "unknown error"


def not_started(overrides: Sequence[str], signum: int) -> JobReturn:
    end = JobEndError("not started", signal.Signals(signum).name, signum)
    return JobReturn(overrides=list(overrides), status=JobStatus.FAILED, _return_value=end)


class CheckedJobs:
    """The sweep's config loader, which hands the launcher each job's config as the sweep's
    check composed it and keeps its fingerprint for the job (in a joblib worker too, where the
    loader travels with the job's task). Other jobs and calls go to Hydra's loader.

    Args:
        loader: Hydra's config loader.
        checked: a job's overrides -> its composed config and fingerprint.
    """

    def __init__(self, loader: Any, checked: dict[tuple[str, ...], tuple[DictConfig, dict]]):
        self.loader, self.checked = loader, checked

    def __getattr__(self, name: str) -> Any:
        if name in ("loader", "checked"):  # unpickling: not set yet
            raise AttributeError(name)
        return getattr(self.loader, name)

    def only(self, overrides: Sequence[str]) -> CheckedJobs:
        """This loader with one job's check only (what a joblib task carries)."""
        key = tuple(overrides)
        return CheckedJobs(self.loader, {key: self.checked[key]} if key in self.checked else {})

    def load_sweep_config(self, master_config: DictConfig, sweep_overrides: list[str]) -> Any:
        """The job's checked config (once), else Hydra's composition of it."""
        if (checked := self.checked.pop(tuple(sweep_overrides), None)) is None:
            return self.loader.load_sweep_config(master_config, sweep_overrides)
        config, fingerprint = checked
        keep_checked(run_dir_of(config), config.hydra.overrides.task, fingerprint)
        OmegaConf.set_readonly(config.hydra, False)  # as composed: the check's HydraConfig set it
        return config


def takes_checked(launcher: object) -> bool:
    """Whether ``launcher`` trains the sweep's checked configs: the local ones (basic, and
    ``joblib_local``, whose tasks carry their own job's). A job another launcher runs (SLURM,
    the plugins' own) is checked again where it trains: that machine's devices and memory."""
    return runs_in_process(launcher) or getattr(launcher, "takes_checked", False)


def runs_in_process(launcher: object) -> bool:
    """Whether ``launcher`` is Hydra's basic one (by name: Hydra's plugin scan defines its
    classes twice)."""
    return any(cls.__name__ == "BasicLauncher" for cls in type(launcher).__mro__)


class Sweeper(BasicSweeper):
    """Hydra's basic sweeper that checks, stops and reports (see the module docstring)."""

    def __init__(
        self,
        max_batch_size: int | None = None,
        params: dict[str, str] | None = None,
        fail_fast: bool = False,
    ) -> None:
        # not BasicSweeper.__init__: its ``super(BasicSweeper, self)`` names the class that
        # Hydra's plugin scan defines again, of which this one is no subclass
        self.overrides = None
        self.batch_index = 0
        self.max_batch_size = max_batch_size
        self.params = params or {}
        self.hydra_context = self.config = self.launcher = None
        self.fail_fast = fail_fast

    def _jobs(self, arguments: list[str]) -> list[list[str]]:
        from hydra.core.override_parser.overrides_parser import OverridesParser

        params = self._parse_config()
        params.extend(arguments)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        overrides = parser.parse_overrides(params)
        return [list(job) for batch in self.split_arguments(overrides, None) for job in batch]

    def _check(self, jobs: list[list[str]]) -> tuple[list[str], dict[int, str]]:
        """Each job's run directory, and the one-line problem of each job that cannot run; the
        launcher then loads the checked configs (:class:`CheckedJobs`)."""
        loader = self.hydra_context.config_loader
        dirs, problems, checked = [], {}, {}
        for number, overrides in enumerate(jobs):
            config = loader.load_sweep_config(self.config, overrides)
            dirs.append(str(run_dir_of(config)))
            try:
                checked[tuple(overrides)] = config, check_job(config)
            except JOB_ERRORS as error:
                problems[number] = str(error)
        if takes_checked(self.launcher):
            self.hydra_context.config_loader = CheckedJobs(loader, checked)
        return dirs, problems

    def sweep(self, arguments: list[str]) -> Any:
        """Check every job, run them all if each can, then report; exit non-zero unless all
        finished."""
        if self.max_batch_size is not None:  # Hydra's batches: this sweep has none to split
            sys.exit(
                f"error: hydra.sweeper.max_batch_size: got {self.max_batch_size}; allowed: null "
                "(the sweep checks every job, then launches them all)"
            )
        try:
            check_writable(Path(self.config.hydra.sweep.dir).absolute(), "hydra.sweep.dir")
        except ConfigError as error:
            sys.exit(f"error: {error}")
        jobs = self._jobs(arguments)
        dirs, problems = self._check(jobs)
        if problems:
            sys.exit(problems_message(jobs, problems))
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        relays = runs_in_process(self.launcher) or getattr(self.launcher, "stops_with_sweep", 0)
        with relay_stop_signals() if relays else contextlib.nullcontext(SweepStop()) as stop:
            returns = self._launch(jobs, stop)
        outcomes = [Outcome(k, jobs[k], dirs[k], *outcome_of(r)) for k, r in enumerate(returns)]
        report(outcomes, stop)
        return [returns]

    def _launch(self, jobs: list[list[str]], stop: SweepStop) -> list:
        """Launch ``jobs``: all at once, or (basic launcher) one by one, stopping between."""
        if not runs_in_process(self.launcher):
            self.launcher.fail_fast = self.fail_fast
            return list(self.launcher.launch(jobs, initial_job_idx=0))
        returns = []
        log.info("Launching %d jobs locally, one after another", len(jobs))
        with _without_launch_lines():
            for number, overrides in enumerate(jobs):
                returns.append(self._launch_one(number, overrides, stop))
        return returns

    def _launch_one(self, number: int, overrides: list[str], stop: SweepStop) -> Any:
        """Launch job ``number`` by itself (not once the sweep was stopped); note its stop."""
        if stop.signum is not None:
            return not_started(overrides, stop.signum)
        (ret,) = self.launcher.launch([overrides], initial_job_idx=number)
        kind, _ = outcome_of(ret)
        if kind == "interrupted":
            stop.note(ret._return_value.signum)
        elif kind == "failed" and self.fail_fast:
            stop.request(signal.SIGTERM, "fail_fast")
        return ret


class _LaunchLine(logging.Filter):
    """Drops the basic launcher's ``Launching 1 jobs locally`` (it is called once per job)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Launching ")


@contextlib.contextmanager
def _without_launch_lines() -> Iterator[None]:
    launcher_log = logging.getLogger("hydra._internal.core_plugins.basic_launcher")
    line = _LaunchLine()
    launcher_log.addFilter(line)
    try:
        yield
    finally:
        launcher_log.removeFilter(line)


def problems_message(jobs: list[list[str]], problems: dict[int, str]) -> str:
    """The lines of a sweep with jobs that cannot run: one per job, or one for the whole sweep
    when every job has the same problem (an offline machine without the data, say)."""
    head = f"error: {len(problems)} of {len(jobs)} jobs of this sweep cannot run"
    if len(problems) == len(jobs) > 1 and len(set(problems.values())) == 1:
        return f"{head}, all for one reason; none started: {next(iter(problems.values()))}"
    lines = [f"  job {k} ({' '.join(jobs[k])}): {line}" for k, line in problems.items()]
    return "\n".join([f"{head}; none started", *lines])


def report(outcomes: list[Outcome], stop: SweepStop) -> None:
    """One line per failed job, one for a stopped sweep; exit 128 + signal, 1, or return."""
    failed = [o for o in outcomes if o.kind == "failed"]
    lines = [f"error: {o.describe()}: {o.line}" for o in failed]
    stopped = [o for o in outcomes if o.kind == "interrupted"]
    waiting = [o for o in outcomes if o.kind == "not started"]
    if stop.signum is not None:
        why = "hydra.sweeper.fail_fast=true" if stop.reason == "fail_fast" else stop.reason
        lines.append(
            f"interrupted ({why}): {len(stopped)} jobs interrupted "
            f"({', '.join(o.run_dir for o in stopped) or 'none'}), {len(waiting)} never started "
            f"({', '.join(f'job {o.number}' for o in waiting) or 'none'}); "
            "the same command resumes the sweep"
        )
    for line in lines:
        print(line, file=sys.stderr)
    sys.stderr.flush()
    if stop.signum is not None and stop.reason != "fail_fast":
        sys.exit(128 + stop.signum)
    if failed:
        sys.exit(1)
