"""What a failed job says: the one line of an error, and how a sweep's job reports its end.

A user error (a bad config, a damaged or unwritable run file, a run directory in use, a loss
that is no longer finite) has a message written for users: one line, no traceback. Any other
error is named by its type and the first line of its message.
"""

from __future__ import annotations

from hydra.errors import InstantiationException

from grab_exp.data.checks import DataError
from grab_exp.logging.build import LoggerBuildError
from grab_exp.logging.files import DamagedFileError, WriteError
from grab_exp.logging.guard import LoggerIdError
from grab_exp.per_sample.modules import UserCodeError
from grab_exp.runner.config.schema import ConfigError
from grab_exp.runner.config.target_errors import (
    one_cause,
    raised_at,
    raised_by_grab_exp,
    target_error_line,
)
from grab_exp.runner.rundir.lock import RunDirInUseError


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


#: errors whose message is written for users: one ``error: ...`` line, no traceback
USER_ERRORS = (
    ConfigError,
    DamagedFileError,
    RunDirInUseError,
    WriteError,
    NonFiniteLossError,
    LoggerIdError,
    LoggerBuildError,
    DataError,
)


def user_error_line(error: BaseException) -> str | None:
    """The one-line message of a user error, or ``None`` for anything else (keeps its traceback).

    User errors are the :data:`USER_ERRORS` and what a ``_target_`` raised, which Hydra's
    ``instantiate`` wraps in an ``InstantiationException``: one of this package's (e.g. a
    dataset loader) says its own line (a library's error under it keeps its traceback); a
    user's is named with its error and file
    (:func:`~grab_exp.runner.config.target_errors.target_error_line`).
    """
    if isinstance(error, USER_ERRORS):
        return str(error)
    if isinstance(error, UserCodeError):  # the user's model or loss raised while training
        where = raised_at(error.error)
        return f"{error.setting}: {error.target} raised {one_cause(error.error)}{where}"
    if not isinstance(error, InstantiationException):
        return None
    cause = error.__cause__
    if cause is not None and raised_by_grab_exp(cause) and str(cause).strip():
        return str(cause).strip().splitlines()[0]
    if "target 'grab_exp." in str(error):  # a library's failure or a bug under one of ours
        return None
    return target_error_line(error)  # a user's target (a loader, a model) that raised


def error_record(error: BaseException) -> dict[str, str]:
    """``{"type": ..., "message": <one line>}``: the ``error`` field of a failed run's summary."""
    line = user_error_line(error)
    if line is None:
        lines = str(error).strip().splitlines()
        line = f"{type(error).__name__}: {lines[0]}" if lines else type(error).__name__
    return {"type": type(error).__name__, "message": line}


class JobEndError(Exception):
    """How a job of a multirun ended other than ``finished``; Hydra records it as the job's
    return, and :class:`~grab_exp.runner.launch.sweeper.Sweeper` reads it (picklable: plain args).

    Attributes:
        kind: ``failed``, ``interrupted`` or ``not started``.
        line: the job's one line (its error, or the signal's name).
        signum: the stop signal (interrupted, not started), else 0.
    """

    def __init__(self, kind: str, line: str, signum: int = 0) -> None:
        super().__init__(kind, line, signum)
        self.kind, self.line, self.signum = kind, line, signum

    def __str__(self) -> str:
        return self.line
