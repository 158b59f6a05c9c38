"""Running ``python -m grab_exp`` in tests: compose its config, run it, build its jobs.

* :func:`compose_config` composes ``conf/`` with Hydra's compose API, exactly as the command
  does (schema, resolvers and the ``distributed=true`` shorthand included).
* :func:`run_grab` runs the real command in a subprocess; :class:`Job` starts one in the
  background. ``grab_env`` gives a subprocess offline W&B inside a temporary folder, ``cli_env``
  no W&B at all. :func:`run_in_process` runs the same command in this process, for tests that
  need a finished run's files but no exit status, signal or second process.
* :func:`compose_job` builds the job the command would train, in this process, and
  :func:`train_epochs` trains it with the runner's own step loop.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import random
import runpy
import signal
import subprocess
import sys
import warnings
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from hydra.core.global_hydra import GlobalHydra
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from grab_exp.__main__ import expand_shorthands
from grab_exp.runner.config import check as config_check
from grab_exp.runner.config.check import validate_config
from grab_exp.runner.launch import override_keys
from grab_exp.runner.training import signals as stop_signals
from grab_exp.runner.training.build import TrainingJob, build_job
from grab_exp.runner.training.connect import connect
from grab_exp.runner.training.epoch import train_steps
from grab_exp.runner.training.progress import Progress
from support import REPO_ROOT

CONF_DIR = REPO_ROOT / "conf"
ARCHIVE = REPO_ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
needs_archive = pytest.mark.skipif(
    not ARCHIVE.is_file(), reason=f"CIFAR-10 JPEG archive absent: {ARCHIVE}"
)
GRAB = [sys.executable, "-m", "grab_exp"]
SMOKE = ["experiment=smoke", "progress=line", "device=cpu"]  # CPU runs on any machine
RUN_TIMEOUT_S = 240
#: the variable W&B sets in a process that started its service, which children connect to
WANDB_SERVICE = "WANDB_SERVICE"
# small synthetic CIFAR-shaped data; the run's own model, ordering, pipeline and optimizer
SMALL_RUN = ("experiment=smoke", "dataset.num_test=16", "progress=none")
# every outgoing HTTP(S) connection of a subprocess goes to a closed local port: the cifar10
# download fails at once, online or not (and never fetches 170 MB)
DEAD_PROXY = "http://127.0.0.1:9"
OFFLINE_ENV = {
    **{name: DEAD_PROXY for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
    "NO_PROXY": "",
    "no_proxy": "",
}


# --- composing -----------------------------------------------------------------------------


def compose_config(overrides: Iterable[str] = (), *, hydra: bool = False) -> DictConfig:
    """Compose ``conf/config.yaml`` with ``overrides``, as ``python -m grab_exp`` would.

    Args:
        overrides: Hydra command-line overrides (``distributed=true`` included).
        hydra: also return the ``hydra`` node (launcher, sweeper, runtime choices).
    """
    return override_keys.compose_config(expand_shorthands(list(overrides)), hydra=hydra)


def group_options() -> list[tuple[str, str]]:
    """``(group, option)`` for every ``conf/<group>/<option>.yaml`` (nested groups included).

    Files at the top of ``conf/`` (the root config, shared option files) are no group's.
    """
    options = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        group = path.parent.relative_to(CONF_DIR).as_posix()
        if group != ".":
            options.append((group, path.stem))
    return options


def root_default_groups() -> set[str]:
    """Groups named in ``conf/config.yaml``'s defaults list (overridden as ``group=option``)."""
    groups = set()
    for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults:
        if isinstance(entry, DictConfig):
            groups.update(str(key).removeprefix("override ").strip() for key in entry)
    return groups


def option_override(group: str, option: str) -> str:
    """``group=option`` for a group of the root defaults list, ``+group=option`` otherwise."""
    prefix = "" if group in root_default_groups() else "+"
    return f"{prefix}{group}={option}"


def cifar10_in_place(cfg: DictConfig, folder: Path) -> None:
    """Point ``cfg``'s ``dataset=cifar10`` at ``folder`` holding CIFAR-10's file names (empty
    files): the startup check, which reads no data, then passes without the 170 MB download."""
    from grab_exp.data.cifar10 import BATCH_FILES, BATCHES_FOLDER

    if cfg.dataset._target_ != "grab_exp.data.load_cifar10":
        return
    batches = folder / BATCHES_FOLDER
    batches.mkdir(parents=True, exist_ok=True)
    for name in BATCH_FILES:
        (batches / name).touch()
    cfg.dataset.data_dir = str(folder)


# --- running the command -------------------------------------------------------------------


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


def cli_env(**extra: str) -> dict[str, str]:
    """Environment of a ``python -m grab_exp`` subprocess: no W&B, Hydra's default errors."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("WANDB_") and k != "HYDRA_FULL_ERROR"
    }
    env.update(WANDB_MODE="disabled", WANDB_SILENT="true", **extra)
    return env


def run_grab(
    args: Iterable[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    timeout: float = RUN_TIMEOUT_S,
    *,
    merge_stderr: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m grab_exp *args`` in ``cwd`` to the end.

    With ``merge_stderr`` (the default) stdout and stderr come together in ``.stdout``; else
    apart, exactly as a user's terminal shows them.
    """
    return subprocess.run(
        [*GRAB, *args],
        cwd=cwd,
        env=cli_env() if env is None else env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT if merge_stderr else subprocess.PIPE,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_cli(
    args: Iterable[str], cwd: Path, *, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """:func:`run_grab` without W&B and with stdout and stderr apart."""
    return run_grab(args, cwd, cli_env(**env), timeout, merge_stderr=False)


def run_in_process(
    args: Iterable[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    *,
    merge_stderr: bool = True,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m grab_exp *args`` in ``cwd`` in this process, as :func:`run_grab` would in
    a subprocess: the same entry point (``grab_exp/__main__.py`` run as ``__main__``, so the
    shorthands, the key check, Hydra's composition, callbacks and run directory), ``env`` as the
    whole environment (``grab_env``, ``cli_env``; its ``OMP_NUM_THREADS`` sets torch's threads),
    its output captured. ``SystemExit`` gives the exit status.

    Everything the run changes in this process comes back afterwards: the working directory,
    ``sys.argv``, the environment, the logging handlers and levels Hydra configured (its log
    files closed), Hydra's global state, the W&B singleton (torn down before and after), the
    stop-signal handlers and latches, the jobs checked and not yet taken, CUDA's numerics flags,
    torch's thread count and the random generators.
    """
    args, env = list(args), cli_env() if env is None else env
    out, err = io.StringIO(), io.StringIO()
    status = 0
    with (
        _restored_process_state(),
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(out if merge_stderr else err),
    ):
        os.environ.clear()
        os.environ.update(env)
        if threads := env.get("OMP_NUM_THREADS"):
            torch.set_num_threads(int(threads))
        os.chdir(cwd)
        sys.argv = ["grab_exp", *args]  # argv[0]: runpy sets grab_exp/__main__.py's path
        try:
            with warnings.catch_warnings():  # grab_exp.__main__ is imported already (here)
                warnings.filterwarnings("ignore", "'grab_exp.__main__' found", RuntimeWarning)
                runpy.run_module("grab_exp", run_name="__main__", alter_sys=True)
        except SystemExit as stop:
            status = _exit_status(stop.code)
    return subprocess.CompletedProcess([*GRAB, *args], status, out.getvalue(), err.getvalue())


def _exit_status(code: object) -> int:
    """The status ``sys.exit(code)`` gives a process (a message goes to stderr, status 1)."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


@contextlib.contextmanager
def _restored_process_state() -> Iterator[None]:
    """Put back what an in-process run changes in this process (see :func:`run_in_process`)."""
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    loggers = [logger for logger in loggers if isinstance(logger, logging.Logger)]
    saved_loggers = [(lg, lg.level, lg.propagate, lg.disabled, lg.handlers[:]) for lg in loggers]
    wandb_teardown()  # before the environment is saved: it names no service that is gone
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv[:]
    saved_signals = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    saved_hydra, threads = HydraConfig.instance().cfg, torch.get_num_threads()
    rng = (torch.get_rng_state(), random.getstate(), np.random.get_state())
    flags = [(owner, name, getattr(owner, name)) for owner, name in _cuda_policy_flags()]
    checked = dict(config_check._CHECKED)  # jobs checked and not yet taken
    latches = [(state, state[:]) for state in _signal_state()]
    GlobalHydra.instance().clear()
    try:
        yield
    finally:
        wandb_teardown()
        for owner, name, value in flags:  # in set_cuda_policy's order: legacy setters first
            if getattr(owner, name) != value:
                setattr(owner, name, value)
        config_check._CHECKED.clear()
        config_check._CHECKED.update(checked)
        for state, saved in latches:
            state[:] = saved
        GlobalHydra.instance().clear()
        HydraConfig.instance().cfg = saved_hydra
        for logger, level, propagate, disabled, handlers in saved_loggers:
            for handler in logger.handlers:
                if handler not in handlers:
                    handler.close()
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate, logger.disabled = propagate, disabled
        for signum, handler in saved_signals.items():
            signal.signal(signum, handler)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(threads)
        torch.set_rng_state(rng[0])
        random.setstate(rng[1])
        np.random.set_state(rng[2])


def _cuda_policy_flags() -> list[tuple[object, str]]:
    """The torch backend flags :func:`grab_exp.devices.set_cuda_policy` sets, in its order."""
    backends = torch.backends
    flags = [(backends.cudnn, name) for name in ("deterministic", "benchmark")]
    flags += [(backends.cuda.matmul, "allow_tf32"), (backends.cudnn, "allow_tf32")]
    if hasattr(backends.cudnn, "conv"):  # torch >= 2.9
        flags += [(backends.cuda.matmul, "fp32_precision")]
        flags += [(backends.cudnn.conv, "fp32_precision"), (backends.cudnn.rnn, "fp32_precision")]
    return flags


def _signal_state() -> list[list]:
    """The stop-signal module's state lists: pending, received (a worker's latch), latched."""
    return [stop_signals._pending, stop_signals._received, stop_signals._latched]


def wandb_teardown() -> None:
    """End W&B's process-wide singleton and service, if a run started them, and the
    ``WANDB_SERVICE`` variable that names the service (a child would connect to it)."""
    if "wandb" in sys.modules:
        sys.modules["wandb"].teardown()
    os.environ.pop(WANDB_SERVICE, None)


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


# --- the job in this process ---------------------------------------------------------------


def compose_job(overrides: Iterable[str], device: str = "cpu") -> TrainingJob:
    """The job ``python -m grab_exp experiment=smoke <overrides>`` would train, on ``device``."""
    cfg = compose_config([*SMALL_RUN, f"device={device}", *overrides])
    validate_config(cfg)
    strategy = connect(cfg)  # as a run does: CUDA's numerics policy (deterministic cuDNN, no TF32)
    data = instantiate(cfg.dataset).to(strategy.device)
    return build_job(cfg, data, strategy)


class LossRecorder(Progress):
    """A silent progress display that keeps every step's loss ``()`` (device tensors)."""

    def __init__(self) -> None:
        super().__init__("none")
        self.losses: list[torch.Tensor] = []

    def step(self, loss: torch.Tensor) -> None:
        """Keep a copy of the step's loss (no host read)."""
        self.losses.append(loss.detach().clone())


def train_epochs(job: TrainingJob, epochs: int, start: int = 0) -> torch.Tensor:
    """Train epochs ``start .. start + epochs - 1`` with the runner's step loop.

    Returns:
        Every step's loss ``(steps,)``.
    """
    recorder = LossRecorder()
    for epoch in range(start, start + epochs):
        job.parts.ordering.set_epoch(epoch)
        train_steps(job, recorder)
    return torch.stack(recorder.losses)


def run_job_here(overrides: Iterable[str], run_dir: Path) -> dict:
    """The runner's whole job in this process, as ``python -m grab_exp <overrides>
    hydra.run.dir=<run_dir>`` runs it; returns its final metrics."""
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import open_dict

    from grab_exp.runner.training.job import run_job

    previous = HydraConfig.instance().cfg
    try:
        cfg = compose_config(overrides, hydra=True)
        with open_dict(cfg):
            cfg.hydra.runtime.output_dir = str(run_dir)
        HydraConfig.instance().set_config(cfg)
        return run_job(cfg)
    finally:
        HydraConfig.instance().cfg = previous
