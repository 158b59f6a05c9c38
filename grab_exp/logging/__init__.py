"""Run logging: the local store (always on) and the loggers beside it (:class:`RunLogger`: a
fail-soft W&B mirror, and any ``logger.extra`` one).

Importing this package is cheap: ``torch`` and ``wandb`` are imported only when used.
"""

from grab_exp.logging.base import RunLogger
from grab_exp.logging.build import build_loggers, logger_problem
from grab_exp.logging.files import atomic_torch_save, atomic_write_text, read_json, write_json
from grab_exp.logging.local import LocalStore, git_commit, library_versions
from grab_exp.logging.wandb_logger import WandbLogger, WandbUnavailableWarning, build_wandb_logger
from grab_exp.logging.wandb_mode import resolve_mode

__all__ = [
    "LocalStore",
    "RunLogger",
    "WandbLogger",
    "WandbUnavailableWarning",
    "atomic_torch_save",
    "atomic_write_text",
    "build_loggers",
    "build_wandb_logger",
    "git_commit",
    "library_versions",
    "logger_problem",
    "read_json",
    "resolve_mode",
    "write_json",
]
