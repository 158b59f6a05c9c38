"""A job's loggers kept apart from its run directory: what a logger does never reaches it.

:class:`GuardedLogger` wraps one :class:`~grab_exp.logging.base.RunLogger` for the runner:

* each call gets copies of its own (a fresh deep copy of each row and of the config, plain
  dicts, so ``json.dumps(row)`` works), so a logger that edits or extends a row changes
  nothing the runner keeps, nor what another logger gets;
* what a call changes of the process's own state that training reads (torch's default dtype and
  CPU random state, the working directory) is put back after it, with one warning the first time;
* each call runs in a daemon thread and is bounded in time (``timeout_s``) and by a stop
  signal that arrives during it (the ``stop`` predicate): a hung logger does not wedge the job;
* a Python warning a call issues is one warning line naming the setting;
* a call that raises or times out is one warning line naming the setting
  (``logger.extra.<name>`` or ``logger.wandb``) and the error; the logger is skipped from then on;
* :meth:`GuardedLogger.start` checks the id the logger returns: a ``str`` or ``None``, else the
  job is refused in one line (:class:`LoggerIdError`) before its first epoch.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from grab_exp.logging.base import RunLogger

log = logging.getLogger("grab_exp")
#: how long one logger call may take before the logger is skipped (W&B's own init may take 30 s)
CALL_TIMEOUT_S = 90.0
_POLL_S = 0.05


class LoggerIdError(ValueError):
    """A logger's ``start`` returned an id that is not a string (the checkpoint keeps ids)."""


def own_copy(mapping: Mapping[str, Any]) -> dict[str, Any]:
    """A deep copy of ``mapping`` for one logger call: what the logger does to it stays there."""
    return copy.deepcopy(dict(mapping))


def setting_of(name: str) -> str:
    """The config key a logger comes from: ``logger.wandb`` or ``logger.extra.<name>``."""
    return "logger.wandb" if name == "wandb" else f"logger.extra.{name}"


class GuardedLogger:
    """One logger as the runner calls it: copies in, failures and hangs isolated.

    Args:
        name: The logger's name (``wandb`` or its ``logger.extra`` key).
        logger: The logger.
        stop: Whether a stop signal arrived; a call that is running when one arrives is
            abandoned (the logger is skipped from then on).
        timeout_s: The bound on one call.
    """

    def __init__(
        self,
        name: str,
        logger: RunLogger,
        stop: Callable[[], bool] = lambda: False,
        timeout_s: float = CALL_TIMEOUT_S,
    ) -> None:
        self.name = name
        self.setting = setting_of(name)
        self.logger = logger
        self.stop = stop
        self.timeout_s = timeout_s
        self.failure: str | None = None
        self.restored = False  # whether a call's change of the process was put back before

    def start(
        self,
        run_dir: str | os.PathLike[str],
        config: Mapping[str, Any],
        resume_id: str | None,
        rows: Sequence[Mapping[str, Any]],
    ) -> str | None:
        """The logger's :meth:`~RunLogger.start`; its id, ``None`` if it failed.

        Raises:
            LoggerIdError: the id is neither a string nor ``None`` (one line naming the setting).
        """
        copies = (own_copy(config), [own_copy(row) for row in rows])
        run_id = self._call("start", self.logger.start, run_dir, copies[0], resume_id, copies[1])
        if run_id is not None and not (isinstance(run_id, str) and run_id):
            raise LoggerIdError(
                f"{self.setting}: start returned {type(run_id).__name__} {run_id!r} as its run "
                "id; allowed: a non-empty str (kept in checkpoint.pt to resume) or None"
            )
        return run_id

    def log(self, row: Mapping[str, Any], epoch: int) -> None:
        """The logger's :meth:`~RunLogger.log` with a copy of ``row``."""
        self._call("log", self.logger.log, own_copy(row), epoch)

    def finish(self, status: str, summary: Mapping[str, Any]) -> None:
        """The logger's :meth:`~RunLogger.finish` with a copy of ``summary``."""
        self._call("finish", self.logger.finish, status, own_copy(summary))

    def _call(self, method: str, call: Callable[..., Any], *args: Any) -> Any:
        """``call(*args)`` in a thread, bounded; its result, or ``None`` after a failure."""
        if self.failure is not None:
            return None
        outcome: dict[str, Any] = {}

        def target() -> None:
            try:
                outcome["result"] = call(*args)
            except BaseException as error:  # a logger's SystemExit must not end the job either
                outcome["error"] = error

        thread = threading.Thread(target=target, name=f"{self.setting}.{method}", daemon=True)
        stopped_before = self.stop()
        deadline = time.monotonic() + self.timeout_s
        state = _process_state()
        # the logger's warnings (W&B's failure) become one line naming it, not Python's two
        # lines quoting this module's source; caught here, in the thread that waits, so that a
        # call abandoned still running cannot keep the job's own warnings caught
        with warnings.catch_warnings(record=True) as caught:  # the filters as they are
            thread.start()
            try:
                while thread.is_alive() and time.monotonic() < deadline:
                    if not stopped_before and self.stop():
                        break
                    thread.join(_POLL_S)
            finally:
                self._restore(method, state)
        for warning in caught:
            first_line = (str(warning.message).strip().splitlines() or [""])[0]
            log.warning("%s: %s", self.setting, first_line)
        if thread.is_alive():
            why = "a stop signal arrived" if self.stop() else f"no answer in {self.timeout_s:g} s"
            return self._fail(method, f"abandoned ({why})")
        if "error" in outcome:
            error = outcome["error"]
            first_line = (str(error).strip().splitlines() or [""])[0]
            return self._fail(method, f"{type(error).__name__}: {first_line}")
        return outcome.get("result")

    def _restore(self, method: str, state: dict[str, Any]) -> None:
        """Put back what the call changed of ``state`` (:func:`_process_state`); the first time,
        one warning."""
        changed = [key for key, value in _process_state().items() if not _same(value, state[key])]
        if not changed:
            return
        torch.set_default_dtype(state["torch default dtype"])
        torch.set_rng_state(state["torch random state"])
        if state["working directory"] is not None:
            os.chdir(state["working directory"])
        if self.restored:
            return
        self.restored = True
        log.warning(
            "%s: %s changed %s; put back (a logger must not change what training reads)",
            self.setting,
            method,
            ", ".join(changed),
        )

    def _fail(self, method: str, problem: str) -> None:
        self.failure = f"{method} failed: {problem}"
        log.warning(
            "%s: %s; this logger is skipped from now on (metrics.csv, summary.json and the "
            "checkpoint are unaffected)",
            self.setting,
            self.failure,
        )


def _process_state() -> dict[str, Any]:
    """The process-wide state a logger's call could change under training."""
    return {
        "torch default dtype": torch.get_default_dtype(),
        "torch random state": torch.get_rng_state(),
        "working directory": _cwd(),
    }


def _cwd() -> str | None:
    try:
        return os.getcwd()
    except OSError:  # the folder was removed under the process
        return None


def _same(a: Any, b: Any) -> bool:
    return torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
