"""An exclusive lock per run directory: one job at a time resumes, skips or overwrites it.

The lock is ``fcntl.flock`` on ``<run_dir>/.lock``. The kernel drops it when its process ends,
however it ends (SIGKILL included), so a dead job never blocks the directory. The file holds
the holder's pid, host and start time, for the error line a second job prints. A clean release
empties the file: a job that gets the lock and finds the file non-empty takes over the lock of
a process that died holding it (a stale lock) and says so.

``flock`` works on local file systems and on most shared ones (NFSv4, Lustre, GPFS, BeeGFS;
NFSv3 only with a working ``lockd``); docs/troubleshooting.md lists caveats.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

log = logging.getLogger("grab_exp")
LOCK_NAME = ".lock"


class RunDirInUseError(RuntimeError):
    """Another live job holds the run directory: ``<dir> is in use by pid <p> on <host> ...``."""


def holder() -> dict[str, Any]:
    """This process as a lock holder: pid, host and the time (UTC, ISO 8601)."""
    now = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    return {"pid": os.getpid(), "host": socket.gethostname(), "since": now}


def _read_holder(fd: int, attempts: int = 1) -> dict[str, Any]:
    """The holder recorded in the open lock file ``fd`` (``{}`` when empty or unreadable).

    A job that just took the lock writes its record a moment later: ``attempts`` > 1 waits
    for it up to 50 ms each.
    """
    for attempt in range(attempts):
        raw = os.pread(fd, 4096, 0)
        try:
            record = json.loads(raw) if raw.strip() else {}
        except ValueError:
            record = {}
        if record or attempt == attempts - 1:
            return record if isinstance(record, dict) else {}
        time.sleep(0.05)
    return {}


def _describe(record: dict[str, Any]) -> str:
    return (
        f"pid {record.get('pid', '?')} on {record.get('host', '?')} "
        f"since {record.get('since', '?')}"
    )


def _lock_or_refuse(fd: int, run_dir: Path, kind: int = fcntl.LOCK_EX) -> None:
    """Lock the open lock file ``fd`` without waiting, or raise naming its live holder."""
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        record = _read_holder(fd, attempts=10)
        raise RunDirInUseError(f"{run_dir} is in use by {_describe(record)}") from None


def check_free(run_dir: Path) -> None:
    """Refuse early (creating nothing) when a live job holds ``run_dir``'s lock.

    Only a first look, before Hydra writes its files into the directory; :class:`RunLock`
    decides. The look takes a shared lock for an instant, so the looks of a data-parallel
    job's ranks never refuse each other.

    Raises:
        RunDirInUseError: as :meth:`RunLock.acquire`.
    """
    with reading_lock(run_dir):
        pass


@contextlib.contextmanager
def reading_lock(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock shared while its files are read (a reader of finished runs): a
    job cannot take the directory meanwhile. Creates nothing; no lock file, nothing to hold.

    Raises:
        RunDirInUseError: a live job holds the directory (as :meth:`RunLock.acquire`).
    """
    try:
        fd = os.open(Path(run_dir) / LOCK_NAME, os.O_RDONLY)  # a read-only copy of a run too
    except FileNotFoundError:
        yield
        return
    try:
        _lock_or_refuse(fd, Path(run_dir), fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # also drops the lock


def _alive_here(pid: object) -> bool:
    """Whether a process numbered ``pid`` exists on this host (any owner)."""
    if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _why_stale(record: dict[str, Any]) -> str:
    """Why a lock whose file names ``record`` could be taken: its holder's end, in words."""
    if record.get("host") != socket.gethostname():
        return "that process no longer holds it"
    if _alive_here(record.get("pid")):
        return "that job ended; its pid now belongs to another process"
    return "that process is gone"


class RunLock:
    """The exclusive lock of ``run_dir`` (created when missing).

    Attributes:
        info: the holder record written into the lock file (pid, host, since) once acquired.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_NAME
        self.info: dict[str, Any] = {}
        self._fd: int | None = None

    def acquire(self) -> dict[str, Any]:
        """Take the lock without waiting; return this holder's record.

        Raises:
            RunDirInUseError: a live process holds it (the message names its pid, host and time).
        """
        self.run_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o666)  # less the umask, as open()
        try:
            _lock_or_refuse(fd, self.run_dir)
        except RunDirInUseError:
            os.close(fd)
            raise
        stale = _read_holder(fd)
        if stale:
            log.warning(
                "%s: taking over the stale lock of %s (%s)",
                self.run_dir,
                _describe(stale),
                _why_stale(stale),
            )
        self.info = holder()
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(self.info).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return self.info

    def release(self) -> None:
        """Empty the lock file (a clean end) and drop the lock; no-op when not held."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
            os.close(fd)
