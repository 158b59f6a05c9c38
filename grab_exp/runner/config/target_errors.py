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

from hydra.core.hydra_config import HydraConfig
from hydra.errors import InstantiationException
from omegaconf import DictConfig, OmegaConf

from grab_exp.conf import CONF_DIR
from grab_exp.tracebacks import INSTALLED, PACKAGE_DIR, innermost_file

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


def _shown(path: str | Path) -> str:
    """``path`` relative to the working folder when inside it."""
    absolute = Path(path).absolute()
    return str(absolute.relative_to(Path.cwd())) if absolute.is_relative_to(Path.cwd()) else path


def one_cause(cause: BaseException) -> str:
    """``Type: message`` in one line, with the file an ``OSError`` names."""
    if isinstance(cause, OSError) and cause.filename is not None:
        return f"{type(cause).__name__}: {cause.strerror}: {cause.filename}"
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


def raised_at(cause: BaseException) -> str:
    """`` (file:line)`` of the innermost frame of the user's own code (not of an installed
    package) that ``cause`` passed, or ``""``."""
    frames = traceback.extract_tb(cause.__traceback__)
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(INSTALLED)]
    frame = (own or [None])[-1]
    return f" ({_shown(frame.filename)}:{frame.lineno})" if frame else ""


def _option_file(setting: str, target: str) -> str:
    """`` in <file>``: the YAML file of the job's option of ``setting``'s group, if Hydra has a
    job config and a file in its search path holds it and names ``target``."""
    if not HydraConfig.initialized():
        return ""
    runtime = HydraConfig.get().runtime
    group = setting.split(".")[0]
    option = runtime.choices.get(group)
    for source in runtime.config_sources if option is not None else ():
        folder = {"file": Path(source["path"]), "pkg": CONF_DIR}.get(source["schema"])
        file = folder / group / f"{option}.yaml" if folder is not None else None
        if file is not None and file.is_file() and target in file.read_text():
            return f" in {_shown(file)}"
    return ""


def import_error_line(setting: str, target: str, cause: BaseException | None) -> str:
    """The one line of a ``_target_`` that cannot be imported: the setting, the target, the
    import's own error and the config file that names it."""
    while cause is not None and cause.__cause__ is not None:  # the import's own error
        cause = cause.__cause__
    why = one_cause(cause) if cause is not None else "not found"
    where = _option_file(setting, target)
    return (
        f"{setting}._target_: cannot import {target} ({why}){where}; allowed: "
        "a module.name on the import path (the folder the command runs in is on it)"
    )


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
