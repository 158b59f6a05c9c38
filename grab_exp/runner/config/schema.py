"""Typed schema of ``python -m grab_exp``'s config, registered in Hydra's ``ConfigStore``.

``conf/config.yaml`` composes on top of :class:`RunConfig` (its first defaults entry), so Hydra
itself rejects a wrong type (``epochs=two``) or an unknown key (``trainer.compiled=true``) while
composing (the command says either in one line first:
:mod:`grab_exp.runner.launch.override_keys`). What types cannot say (ranges and choices) is
declared once here in :data:`RANGES` and :data:`CHOICES`; :func:`check_values` checks them.
Rules that tie several keys together live in :mod:`grab_exp.runner.config.check`.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from grab_exp.logging.wandb_mode import MODES as WANDB_MODES
from grab_exp.per_sample import COMPILE_MODES

SCHEMA_NAME = "run_schema"
DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")
#: ``name``: one plain folder name under ``outputs/`` (``hydra.run.dir`` writes elsewhere)
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=,+-]*$")
BACKENDS = ("auto", "gloo", "nccl")


@dataclass
class TrainerConfig:
    """How a training step runs."""

    compile: bool = False
    compile_mode: str = "default"
    tf32: bool = False
    cuda_graph: bool = False


@dataclass
class DistributedConfig:
    """Data-parallel training (``distributed=true`` is short for ``distributed.enabled=true``)."""

    enabled: bool = False
    simulate_workers: int = 0
    workers: int | None = None
    backend: str = "auto"
    timeout_s: float = 300.0


@dataclass
class WandbConfig:
    """The W&B mirror of the local store."""

    enabled: bool = False
    project: str = "grab-exp"
    entity: str | None = None
    mode: str = "auto"
    tags: list[str] = field(default_factory=list)


@dataclass
class LoggerConfig:
    """Loggers besides the always-on local store: W&B, and ``extra`` ones by name (each a node
    with a ``_target_``, a :class:`grab_exp.logging.RunLogger` subclass, and its options)."""

    wandb: WandbConfig = field(default_factory=WandbConfig)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class LrRuleConfig:
    """The square-root learning-rate rule of the VRGD arms."""

    base_lr: float = MISSING
    base_batch_size: int = MISSING


@dataclass
class RunConfig:
    """One job. The group nodes (model, dataset, ...) are ``_target_`` configs of their own."""

    model: Any = MISSING
    dataset: Any = MISSING
    loss: Any = MISSING
    optimizer: Any = MISSING
    balance: Any = MISSING
    pipeline: Any = MISSING
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    name: str = "default"
    seed: int = 0
    epochs: int = 100
    batch_size: int = 16
    eval_batch_size: int = 1000
    device: str = "auto"
    overwrite: bool = False
    progress: str = "auto"
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    lr_rule: LrRuleConfig | None = None


#: key -> (kind, comparison, bound) of every number with a range; every one must be finite
RANGES: dict[str, tuple[str, str, float]] = {
    "seed": ("an integer", ">=", 0),
    "epochs": ("an integer", ">=", 1),
    "batch_size": ("an integer", ">=", 1),
    "eval_batch_size": ("an integer", ">=", 1),
    "distributed.simulate_workers": ("an integer", ">=", 0),
    "distributed.workers": ("an integer", ">=", 1),
    "distributed.timeout_s": ("a number", ">", 0),
    "lr_rule.base_lr": ("a number", ">", 0),
    "lr_rule.base_batch_size": ("an integer", ">=", 1),
    "optimizer.lr": ("a number", ">", 0),
    "optimizer.weight_decay": ("a number", ">=", 0),
    "optimizer.momentum": ("a number", ">=", 0),
    "dataset.subset": ("an integer", ">=", 1),
    "dataset.test_subset": ("an integer", ">=", 1),
    "dataset.num_train": ("an integer", ">=", 1),
    "dataset.num_test": ("an integer", ">=", 1),
}
#: the largest seed: seeds are 32-bit (as NumPy's), so no two seeds ever alias one generator
SEED_MAX = 2**32 - 1
#: the progress display's modes (:class:`~grab_exp.runner.training.progress.Progress`)
PROGRESS_MODES = ("auto", "bar", "line", "none")
CHOICES: dict[str, tuple[str, ...]] = {
    "progress": PROGRESS_MODES,
    "trainer.compile_mode": COMPILE_MODES,
    "distributed.backend": BACKENDS,
    "logger.wandb.mode": WANDB_MODES,
}


class ConfigError(ValueError):
    """A composed config that cannot run; its message is ``<key>: got <value>; allowed: ...``."""


def config_error(key: str, value: object, allowed: str) -> ConfigError:
    """The one message style of every config error."""
    return ConfigError(f"{key}: got {value!r}; allowed: {allowed}")


def _in_range(value: object, kind: str, comparison: str, bound: float) -> bool:
    types = (int,) if kind == "an integer" else (int, float)
    if isinstance(value, bool) or not isinstance(value, types) or not math.isfinite(value):
        return False
    return value > bound if comparison == ">" else value >= bound


def check_values(cfg: DictConfig) -> None:
    """Check :data:`RANGES` (finite, in range), :data:`CHOICES`, ``device``, ``name`` and that
    every float option is finite.

    Keys that are absent, or ``null``, are skipped (optional nodes, unset options).

    Raises:
        ConfigError: the first bad value.
    """
    for key, (kind, comparison, bound) in RANGES.items():
        value = OmegaConf.select(cfg, key)
        if value is not None and not _in_range(value, kind, comparison, bound):
            raise config_error(key, value, f"{kind} {comparison} {bound}")
    if cfg.seed > SEED_MAX:
        raise config_error("seed", cfg.seed, f"an integer in 0..{SEED_MAX} (a 32-bit seed)")
    for key, allowed in CHOICES.items():
        value = OmegaConf.select(cfg, key)
        if value not in allowed:
            raise config_error(key, value, ", ".join(sorted(allowed)))
    if not DEVICE_PATTERN.match(cfg.device):
        raise config_error("device", cfg.device, "auto, cpu, cuda, cuda:<k>")
    if not NAME_PATTERN.match(cfg.name) or ".." in cfg.name:
        allowed = "a plain folder name (letters, digits, _ . = , + -; no / or ..); "
        raise config_error("name", cfg.name, allowed + "hydra.run.dir=<path> writes elsewhere")
    check_finite(cfg)


def check_finite(cfg: DictConfig) -> None:
    """Every float option of the job (``hydra`` settings aside) is finite.

    Raises:
        ConfigError: the first NaN or infinity, by its dotted key.
    """
    for key, value in _floats(OmegaConf.to_container(cfg, resolve=False), ""):
        if key != "hydra" and not key.startswith("hydra.") and not math.isfinite(value):
            raise config_error(key, value, "a finite number")


def _floats(node: object, prefix: str):
    """``(dotted key, value)`` of every float in a nested container (interpolations skipped)."""
    if isinstance(node, float):
        yield prefix, node
    if isinstance(node, list):
        node = dict(enumerate(node))
    for key, value in node.items() if isinstance(node, dict) else ():
        yield from _floats(value, f"{prefix}.{key}" if prefix else str(key))


@dataclass
class SweeperConfig:
    """``hydra/sweeper=grab``: the basic sweeper's settings plus ``fail_fast``."""

    _target_: str = "hydra_plugins.grab_exp_plugins.sweeper.GrabSweeper"
    max_batch_size: int | None = None
    params: dict[str, str] | None = None
    fail_fast: bool = False  # true: a job that cannot run starts none; a failure stops the rest


def register_schema() -> None:
    """Store :class:`RunConfig` as ``run_schema`` and the sweeper as ``hydra/sweeper=grab``
    (idempotent)."""
    store = ConfigStore.instance()
    store.store(name=SCHEMA_NAME, node=RunConfig)
    store.store(group="hydra/sweeper", name="grab", node=SweeperConfig, provider="grab_exp")
