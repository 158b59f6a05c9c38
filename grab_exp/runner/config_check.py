"""Validation of the composed config, before any data is loaded.

Every failure is one ``ConfigError`` line naming the key and the allowed values.
"""

from __future__ import annotations

import re

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf

from grab_exp.balance import Balance
from grab_exp.logging.wandb_mode import MODES as WANDB_MODES
from grab_exp.runner.compiled import check_compile_method, check_compile_mode
from grab_exp.runner.progress import PROGRESS_MODES
from grab_exp.validation import (
    check_choice,
    check_int_at_least,
    check_positive,
    check_power_of_two,
)

DEVICE_PATTERN = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


class ConfigError(ValueError):
    """A composed config that cannot run."""


def _check_run(cfg: DictConfig) -> None:
    check_int_at_least("seed", cfg.seed, 0)
    check_int_at_least("epochs", cfg.epochs, 1)
    check_int_at_least("batch_size", cfg.batch_size, 1)
    check_int_at_least("eval_batch_size", cfg.eval_batch_size, 1)
    check_choice("progress", cfg.progress, PROGRESS_MODES)
    if not isinstance(cfg.overwrite, bool):
        raise ValueError(f"overwrite: got {cfg.overwrite!r}; allowed: true, false")
    if not isinstance(cfg.device, str) or not DEVICE_PATTERN.match(cfg.device):
        raise ValueError(f"device: got {cfg.device!r}; allowed: auto, cpu, cuda, cuda:<k>")


def _check_optimizer(cfg: DictConfig) -> None:
    check_positive("optimizer.lr", cfg.optimizer.lr)
    for key in ("weight_decay", "momentum"):
        value = cfg.optimizer.get(key, 0.0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"optimizer.{key}: got {value!r}; allowed: a number >= 0")


def _check_vrgd(cfg: DictConfig) -> None:
    """VRGD optimizers: build one on a dummy parameter (its constructor checks every option)
    and require a pipeline with per-sample gradients."""
    from grab_exp.optim import GSNROptimizer

    cls = get_class(cfg.optimizer._target_)
    if not (isinstance(cls, type) and issubclass(cls, GSNROptimizer)):
        return
    options = OmegaConf.to_container(cfg.optimizer, resolve=True)
    cls([torch.zeros(1, requires_grad=True)], **{k: v for k, v in options.items() if k[0] != "_"})
    if not get_class(cfg.pipeline._target_).provides_per_sample:
        raise ValueError(
            f"pipeline: {cfg.pipeline._target_.rsplit('.', 1)[-1]} gives no per-sample "
            f"gradients, which optimizer {cls.__name__} needs for the GSNR; allowed with it: "
            "functional"
        )


def _balance_class(cfg: DictConfig) -> type[Balance]:
    cls = get_class(cfg.balance._target_)
    if not (isinstance(cls, type) and issubclass(cls, Balance)):
        raise ValueError(f"balance._target_: {cfg.balance._target_} is not a grab_exp Balance")
    return cls


def _check_balance_batch_size(cfg: DictConfig, cls: type[Balance], options: dict) -> None:
    """An ordering that balances within mini-batches must see the run's own batch size."""
    if "batch_size" not in options:
        return
    if options["batch_size"] != cfg.batch_size:
        raise ValueError(
            f"balance.batch_size: got {options['batch_size']!r} but batch_size is "
            f"{cfg.batch_size!r}; allowed: the run's batch_size (the default ${{batch_size}})"
        )
    try:
        check_power_of_two("batch_size", cfg.batch_size)
    except ValueError as error:
        raise ValueError(f"{error} with balance={cls.name}") from None


def _model_size(cfg: DictConfig) -> int:
    """Trainable values of the configured model, built on the meta device (no memory, no data)."""
    with torch.device("meta"):
        model = instantiate(cfg.model)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _check_balance(cfg: DictConfig) -> None:
    """Build the ordering on a tiny problem: its constructor checks every option.

    ``balance.projection_dim`` is checked against the model's real ``d`` (it must be < d).
    """
    cls = _balance_class(cfg)
    options = OmegaConf.to_container(cfg.balance, resolve=True)
    _check_balance_batch_size(cfg, cls, options)
    d = 1 if options.get("projection_dim") is None or not cls.needs_grads else _model_size(cfg)
    cls(max(2, cfg.batch_size), d, **{k: v for k, v in options.items() if not k.startswith("_")})
    pipeline = get_class(cfg.pipeline._target_)
    if cls.needs_grads and not pipeline.provides_per_sample:
        free = sorted(n for n, c in Balance.registry.items() if not c.needs_grads)
        raise ValueError(
            f"pipeline: {cfg.pipeline._target_.rsplit('.', 1)[-1]} gives no per-sample "
            f"gradients, which balance {cls.name!r} needs; allowed with it: {', '.join(free)} "
            "(or pipeline=functional)"
        )


def _check_dataset(cfg: DictConfig) -> None:
    subset = cfg.dataset.get("subset")
    if subset is not None:
        check_int_at_least("dataset.subset", subset, 1)
    if cfg.dataset.get("archive") is not None:
        from grab_exp.data import resolve_archive

        resolve_archive(cfg.dataset.archive)  # one line naming dataset.archive if missing


def _check_logger(cfg: DictConfig) -> None:
    check_choice("logger.wandb.mode", cfg.logger.wandb.mode, WANDB_MODES)


def check_trainer(cfg: DictConfig) -> None:
    """``trainer.compile`` (true/false), ``trainer.compile_mode``, and a compilable method.

    Raises:
        ValueError: one line naming the setting and the allowed values.
    """
    trainer = cfg.get("trainer")
    if trainer is None:
        return
    if not isinstance(trainer.compile, bool):
        raise ValueError(f"trainer.compile: got {trainer.compile!r}; allowed: true, false")
    check_compile_mode(trainer.compile_mode)
    if trainer.compile and "method" in cfg.pipeline:
        check_compile_method(cfg.pipeline.method)


def _check_device(cfg: DictConfig) -> None:
    if cfg.device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(
            f"device: got {cfg.device!r} but CUDA is not available; allowed: auto, cpu"
        )


def validate_config(cfg: DictConfig) -> None:
    """Check types, ranges and cross-field rules of a composed run config.

    Raises:
        ConfigError: one line naming the key and the allowed values.
    """
    try:
        checks = (
            _check_run,
            _check_optimizer,
            _check_vrgd,
            _check_balance,
            _check_dataset,
            _check_logger,
            check_trainer,
            _check_device,
        )
        for check in checks:
            check(cfg)
    except (ValueError, TypeError, FileNotFoundError) as error:
        raise ConfigError(str(error).splitlines()[0]) from error
