"""Where an error was raised: the file of the innermost Python frame its traceback passed, and
whether that file is a user's (neither this package nor installed code such as torch)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

#: this package's folder (``grab_exp/``)
PACKAGE_DIR = Path(__file__).resolve().parent
#: where installed code lives (the standard library, site-packages)
INSTALLED = tuple(
    str(Path(sysconfig.get_paths()[k]).resolve()) for k in ("stdlib", "purelib", "platlib")
)


def innermost_file(error: BaseException) -> Path | None:
    """The resolved file of the innermost Python frame ``error`` passed, or ``None``."""
    tb = error.__traceback__
    if tb is None:
        return None
    while tb.tb_next is not None:
        tb = tb.tb_next
    return Path(tb.tb_frame.f_code.co_filename).resolve()


def raised_in_user_file(error: BaseException) -> bool:
    """Whether ``error``'s innermost frame is in a user's file (not ours, not installed)."""
    file = innermost_file(error)
    return (
        file is not None
        and not file.is_relative_to(PACKAGE_DIR)
        and not str(file).startswith(INSTALLED)
    )
