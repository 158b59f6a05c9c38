"""SIGTERM and SIGINT stop a job at the next step boundary instead of killing it mid-write.

:func:`stop_on_signals` (around a whole job) replaces both handlers by one that only notes the
signal; :func:`check_stop` (at every step boundary and before every epoch) then raises
:class:`JobInterrupted`, which the lifecycle turns into status ``interrupted`` and ``python -m
grab_exp`` into exit status 128 + signal (143 for SIGTERM, 130 for SIGINT) and one line. A
second signal while the first is pending raises at once (an impatient Ctrl-C still works).

In a submitit job (Hydra's ``slurm`` / ``submitit_*`` launchers) submitit's preemption signal
(``USR2`` unless ``SUBMITIT_PREEMPT_SIGNAL`` says otherwise) stops the job the same way; then
:func:`hand_over` calls submitit's own handler, which requeues the job through the launcher's
``checkpoint`` (submitit's checkpointing protocol) and exits; the requeued job runs the same
command, which resumes the run.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_pending: list[int] = []
#: every stop signal this process received, never cleared: a sweep's worker starts no job after one
_received: list[int] = []
_latched: list[bool] = []  # [True] once latch_stop_signals ran (a sweep's worker process)


class JobInterrupted(BaseException):
    """The job stopped on a signal; ``exit_code`` is 128 + the signal's number.

    A ``BaseException`` (like ``KeyboardInterrupt``), so no ``except Exception`` swallows it.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.exit_code = 128 + signum

    def __reduce__(self):
        return type(self), (self.signum,)


def _note(signum: int, frame: object) -> None:
    _received.append(signum)
    if _pending:
        raise JobInterrupted(_pending[0])
    _pending.append(signum)


def _latch(signum: int, frame: object) -> None:
    _received.append(signum)


def latch_stop_signals() -> None:
    """From now on this process only notes stop signals between jobs (a sweep's worker):
    :func:`stop_received` then tells the next job not to start."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _latch)
    _latched[:] = [True]


def stop_received() -> int | None:
    """The first stop signal this process ever received, or ``None``."""
    return _received[0] if _received else None


def exit_on_further_signals(code: int) -> None:
    """A stopping process: another SIGTERM or SIGINT during its last cleanup ends it at once
    with ``code`` (the status it was going to exit with), not with the default -signal."""

    def exit_now(signum: int, frame: object) -> None:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    for signum in STOP_SIGNALS:
        signal.signal(signum, exit_now)


def stop_requested() -> bool:
    """Whether a stop signal arrived (and the job has not stopped yet)."""
    return bool(_pending)


def check_stop() -> None:
    """Raise :class:`JobInterrupted` when a stop signal arrived: call at a step boundary."""
    if _pending:
        raise JobInterrupted(_pending[0])


def preemption_signal() -> int | None:
    """Submitit's preemption / timeout signal in a submitit job, else ``None``."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"))


def hand_over(stop: JobInterrupted) -> None:
    """After a submitit preemption stopped the job: let submitit requeue it (this exits)."""
    if stop.signum == preemption_signal():
        handler = signal.getsignal(stop.signum)
        if callable(handler):
            handler(stop.signum, None)


@contextlib.contextmanager
def stop_on_signals() -> Iterator[None]:
    """Defer SIGTERM, SIGINT (and submitit's preemption signal) to :func:`check_stop` inside
    the block (main thread only); the previous handlers come back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _pending[:] = _received[:1] if _latched else []  # a worker's job: a stop before it began
    preempt = preemption_signal()
    signums = STOP_SIGNALS if preempt is None else (*STOP_SIGNALS, preempt)
    previous = {signum: signal.signal(signum, _note) for signum in signums}
    try:
        yield
    finally:
        stopping = _pending[:1]
        ending = stopping and previous[signal.SIGTERM] == signal.SIG_DFL  # a process about to end
        if ending:  # before any default handler is back: a signal between would end it with -15
            exit_on_further_signals(128 + stopping[0])
        for signum, handler in previous.items():
            if not (ending and signum in STOP_SIGNALS):
                signal.signal(signum, handler)
        _pending.clear()
