"""A job's loggers from its ``logger`` config node: W&B and the ``extra`` ones."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

from hydra.utils import instantiate

from grab_exp.logging.base import RunLogger
from grab_exp.logging.wandb_logger import build_wandb_logger
from grab_exp.tracebacks import import_error_line


class LoggerBuildError(ValueError):
    """A ``logger.extra`` logger whose constructor raised (its options, or its own code)."""


def import_target(path: str) -> Any:
    """The object ``path`` (``module.name``, or ``module.Class.Inner``) names, imported with
    :mod:`importlib` (Hydra's ``get_class`` logs its own error): raises the import's own error
    (``ModuleNotFoundError``, ``AttributeError``...)."""
    module_name, _, attribute = path.rpartition(".")
    if not module_name:
        raise ImportError(f"{path!r} is not a module.name")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as error:  # a class's attribute (module.Class.Inner)?
        if error.name != module_name or "." not in module_name:
            raise
        try:
            module = import_target(module_name)
        except (ImportError, AttributeError):
            raise error from None
    return getattr(module, attribute)


def logger_problem(key: str, node: Mapping[str, Any]) -> str | None:
    """Why ``logger.extra.<key>`` cannot be a logger (one line), or ``None``."""
    setting = f"logger.extra.{key}"
    if key == "wandb":
        return f"{setting}: the name wandb is logger.wandb's (logger=wandb); allowed: another name"
    target = node.get("_target_") if isinstance(node, Mapping) else None
    if not target:
        return f"{setting}: got {node!r}; allowed: a node with a _target_ (a RunLogger subclass)"
    try:
        cls = import_target(str(target))
    except Exception as error:  # the same line as a model's or a loader's
        return import_error_line(setting, str(target), error)
    if not (isinstance(cls, type) and issubclass(cls, RunLogger)):
        return (
            f"{setting}._target_: got {target!r}; allowed: a subclass of grab_exp.logging.RunLogger"
        )
    return None


def build_loggers(cfg: Mapping[str, Any], group: str, name: str) -> dict[str, RunLogger]:
    """The job's loggers by name: ``wandb`` (``logger.wandb``, when enabled) and every
    ``logger.extra.<name>`` node, built from its ``_target_`` with its other keys.

    Raises:
        ValueError: a ``logger.extra`` node that is not a :class:`RunLogger`
            (:class:`LoggerBuildError`: whose constructor raised; one line naming it), or an
            invalid ``logger.wandb.mode``.
    """
    loggers: dict[str, RunLogger] = {}
    if (wandb := build_wandb_logger(cfg.get("wandb"), group=group, name=name)) is not None:
        loggers["wandb"] = wandb
    for key, node in (cfg.get("extra") or {}).items():
        if (problem := logger_problem(key, node)) is not None:
            raise ValueError(problem)
        try:
            loggers[key] = instantiate(node)
        except Exception as error:  # Hydra wraps the constructor's error: name its own
            cause = error.__cause__ or error
            first = (str(cause).strip().splitlines() or [""])[0]
            raise LoggerBuildError(
                f"logger.extra.{key}: {node['_target_']} could not be built "
                f"({type(cause).__name__}: {first})"
            ) from None
    return loggers
