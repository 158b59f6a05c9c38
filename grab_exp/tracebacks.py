"""Where an error was raised: the file of the innermost Python frame its traceback passed, and
whether that file is a user's (neither this package nor installed code such as torch); the
one line of a ``_target_`` that cannot be imported."""

from __future__ import annotations

import sysconfig
from collections.abc import Callable
from pathlib import Path
from types import CodeType

from hydra.core.hydra_config import HydraConfig

from grab_exp.conf import CONF_DIR

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


def user_file(file: Path) -> bool:
    """Whether the resolved ``file`` is a user's (neither this package's nor installed code)."""
    return not file.is_relative_to(PACKAGE_DIR) and not str(file).startswith(INSTALLED)


def raised_in_user_file(error: BaseException) -> bool:
    """Whether ``error``'s innermost frame is in a user's file (not ours, not installed)."""
    file = innermost_file(error)
    return file is not None and user_file(file)


def innermost_ours(error: BaseException) -> CodeType | None:
    """The code of the innermost frame of this package that ``error`` passed, or ``None``."""
    ours, tb = None, error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if Path(code.co_filename).resolve().is_relative_to(PACKAGE_DIR):
            ours = code
        tb = tb.tb_next
    return ours


def raised_in(error: BaseException, function: Callable) -> bool:
    """Whether ``error``'s traceback passed a frame of ``function`` (its code object)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code is not function.__code__:
        tb = tb.tb_next
    return tb is not None


def shown(path: str | Path) -> str:
    """``path`` relative to the working folder when inside it."""
    absolute = Path(path).absolute()
    return str(absolute.relative_to(Path.cwd())) if absolute.is_relative_to(Path.cwd()) else path


def one_cause(cause: BaseException) -> str:
    """``Type: message`` in one line, with the file an ``OSError`` names."""
    if isinstance(cause, OSError) and cause.filename is not None:
        return f"{type(cause).__name__}: {cause.strerror}: {cause.filename}"
    lines = str(cause).strip().splitlines()
    return f"{type(cause).__name__}: {lines[0]}" if lines else type(cause).__name__


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
            return f" in {shown(file)}"
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
