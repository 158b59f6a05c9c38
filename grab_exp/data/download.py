"""What every downloading loader shares: the errors a download raises, a time limit on its
sockets, and the startup check's question to the server (:func:`unreachable`)."""

from __future__ import annotations

import contextlib
import functools
import socket
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator

DOWNLOAD_ERRORS = (urllib.error.URLError, OSError, RuntimeError)
#: seconds a startup check waits for a download server (DNS included) before giving up
REACH_TIMEOUT_S = 5.0


@contextlib.contextmanager
def socket_timeout(seconds: float) -> Iterator[None]:
    """Bound every blocking socket operation (connect, read) opened inside the block."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


@functools.lru_cache(maxsize=8)
def unreachable(url: str, timeout_s: float) -> str | None:
    """Why ``url`` cannot be fetched (a HEAD request), or ``None`` when it answers.

    The request runs in a daemon thread joined for ``timeout_s``, so a name lookup that hangs
    counts as unreachable too. Cached: the startup check runs once per process and URL.
    """
    outcome: list[str | None] = [f"no answer within {timeout_s:g} s"]

    def probe() -> None:
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, method="HEAD"), timeout=timeout_s
            ):
                outcome[0] = None
        except DOWNLOAD_ERRORS as error:
            outcome[0] = reason(error)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout_s)
    return outcome[0]


def reason(error: BaseException) -> str:
    """A download error in one line."""
    return " ".join(str(error).split()) or type(error).__name__
