"""A ``_target_`` that failed: one line naming the setting, the target, the error and its file.

Hydra wraps what a ``_target_`` raises (a user's model, loader, loss or logger) in an
``InstantiationException`` whose message is a block ("Error in call to target ...", the
exception's ``repr``, ``full_key``); a target that cannot be imported gives "Error locating
target". :func:`target_error_line` says the same in one line: the setting (``model``,
``dataset``...), the target, the original error (with the file it could not open, if any) and
where it was raised, or, for an import, the config file that names the target.
"""

from __future__ import annotations

import re
import traceback
from pathlib import Path

from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from grab_exp.tracebacks import (
    PACKAGE_DIR,
    import_error_line,
    innermost_file,
    one_cause,
    shown,
    user_file,
)

_TARGET = re.compile(r"target '([^']+)'")
_FULL_KEY = re.compile(r"full_key: (\S+)")


def _setting(error: InstantiationException, target: str, cfg: DictConfig | None) -> str:
    """The config node whose ``_target_`` failed: Hydra's ``full_key``, else the node of
    ``cfg`` that names ``target``."""
    if found := _FULL_KEY.search(str(error)):
        return found.group(1)
    if cfg is not None:
        for key in ("model", "dataset", "loss", "optimizer", "balance", "pipeline", "logger"):
            node = OmegaConf.select(cfg, key, default=None)
            if isinstance(node, DictConfig) and node.get("_target_") == target:
                return key
    return "_target_"


def raised_at(cause: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of the user's own code (not of an installed
    package, nor of this one) that ``cause`` passed, or ``""``."""
    frames = traceback.extract_tb(cause.__traceback__)
    own = [f for f in frames if user_file(Path(f.filename).resolve())]
    frame = (own or [None])[-1]
    return f" ({shown(frame.filename)}:{frame.lineno})" if frame else ""


def raised_by_grab_exp(error: BaseException) -> bool:
    """Whether ``error`` was raised by this package's own code (a message written for users)."""
    file = innermost_file(error)
    return file is not None and file.is_relative_to(PACKAGE_DIR)


def target_error_line(error: InstantiationException, cfg: DictConfig | None = None) -> str:
    """The one line of a failed ``_target_`` (see the module docstring)."""
    found = _TARGET.search(str(error))
    target = found.group(1) if found else "?"
    setting = _setting(error, target, cfg)
    cause = error.__cause__
    if str(error).startswith("Error locating target"):
        return import_error_line(setting, target, cause)
    if cause is None:
        return f"{setting}: {target} failed: {str(error).strip().splitlines()[-1]}"
    if raised_by_grab_exp(cause) and str(cause).strip():  # ours: a line written for users
        return str(cause).strip().splitlines()[0]
    return f"{setting}: {target} raised {one_cause(cause)}{raised_at(cause)}"
