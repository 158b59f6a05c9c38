"""Startup validation of a composed config, before any data is loaded.

Types and unknown keys are Hydra's job (:mod:`grab_exp.runner.config.schema`); ranges and choices
are declared there too. What is left here are the rules that tie keys together, or a key to its
``_target_`` class. Every failure is one :class:`ConfigError` line,
``<key>: got <value>; allowed: ...``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from hydra._internal.utils import _locate
from hydra.errors import InstantiationException
from hydra.utils import get_class, get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from grab_exp.balance import Ordering
from grab_exp.conf import CONF_DIR
from grab_exp.distributed.join import rank_cuda_index
from grab_exp.distributed.orderings import DistributedOrdering
from grab_exp.optim import GSNROptimizer
from grab_exp.per_sample.compiled import COMPILABLE_METHODS
from grab_exp.runner.config.schema import ConfigError, check_values, config_error
from grab_exp.runner.config.target_errors import import_error_line, target_error_line
from grab_exp.validation import check_power_of_two

__all__ = ["ConfigError", "keep_checked", "take_checked", "validate_config"]
#: the most memory an ordering's balancing state may take (``balance.depth``'s bound)
MAX_BALANCE_BYTES = 16 * 2**30
#: training and test examples of CIFAR-10 (a dataset config without ``num_train``/``num_test``)
CIFAR10_TRAIN = 50_000
CIFAR10_TEST = 10_000


def _options(node: DictConfig) -> dict:
    """A ``_target_`` node's constructor options (``_target_``, ``_partial_`` left out)."""
    options = OmegaConf.to_container(node, resolve=True)
    return {k: v for k, v in options.items() if not k.startswith("_")}


def _class_of(cfg: DictConfig, group: str) -> type:
    return get_class(cfg[group]._target_)


def option_name(cfg: DictConfig, group: str) -> str:
    """The group's option as a user names it, from the config alone (a sweep's jobs differ):
    its class's ``name`` (``cd_grab``), the node's own ``name`` (``mnist``), the one file of
    ``conf/<group>/`` with its ``_target_`` (``classic``), else the class."""
    node = cfg[group]
    name = getattr(get_object(node._target_), "name", None) or node.get("name")
    if isinstance(name, str):
        return name
    files = sorted((CONF_DIR / group).glob("*.yaml"))
    options = [p.stem for p in files if OmegaConf.load(p).get("_target_") == node._target_]
    return options[0] if len(options) == 1 else node._target_.rsplit(".", 1)[-1]


def _check_per_sample(cfg: DictConfig, user: str, alternative: str = "") -> None:
    """``user`` (an ordering or optimizer) needs a pipeline that gives per-sample gradients."""
    if not _class_of(cfg, "pipeline").provides_per_sample:
        allowed = f"functional ({user} needs per-sample gradients){alternative}"
        raise config_error("pipeline", option_name(cfg, "pipeline"), allowed)


def _check_vrgd(cfg: DictConfig) -> None:
    """A VRGD optimizer: its own option checks (built on a dummy parameter), per-sample grads."""
    cls = _class_of(cfg, "optimizer")
    if not (isinstance(cls, type) and issubclass(cls, GSNROptimizer)):
        return
    cls([torch.zeros(1, requires_grad=True)], **_options(cfg.optimizer))
    _check_per_sample(cfg, cls.__name__)
    if cfg.distributed.enabled:
        raise config_error(
            "optimizer", option_name(cfg, "optimizer"), "a plain optimizer with distributed"
        )


#: the sizes a model's options left to the data (``null``) take in the checks that size the
#: model before any data is read (memory, the tree's depth): CIFAR-10's; the run's own model
#: gets the data's
DATA_SIZES = {"num_classes": 10, "in_features": 3 * 32 * 32}


def _meta_model(cfg: DictConfig) -> torch.nn.Module:
    """The configured model built on the meta device: its shapes, no memory, no data."""
    left = {k: v for k, v in DATA_SIZES.items() if k in cfg.model and cfg.model[k] is None}
    with torch.device("meta"):
        return instantiate(cfg.model, **left)


def _model_size(cfg: DictConfig) -> int:
    """Trainable values of the configured model."""
    return sum(p.numel() for p in _meta_model(cfg).parameters() if p.requires_grad)


def _memory_bytes(device: str) -> int:
    """The memory of the device a job with ``device`` trains on (its rank's GPU's, else this
    machine's), read before the job sets its device: the device's properties, since
    ``mem_get_info`` would make a CUDA context on the current GPU (GPU 0, on every rank)."""
    if device.startswith("cuda") or (device == "auto" and torch.cuda.is_available()):
        index = rank_cuda_index(device, torch.cuda.device_count(), dict(os.environ))
        return torch.cuda.get_device_properties(index).total_memory
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _check_model_memory(cfg: DictConfig) -> None:
    """The model's weights and their gradients (the least any step holds) fit the device."""
    parameters = list(_meta_model(cfg).parameters())
    count = sum(p.numel() for p in parameters)
    need = 2 * sum(p.numel() * p.element_size() for p in parameters)
    memory = _memory_bytes(cfg.device)
    if need > memory:
        raise config_error(
            "model",
            option_name(cfg, "model"),
            f"a model that fits in memory: this one has {count:,} parameters, {need:,} bytes "
            f"for its weights and their gradients; the device has {memory:,} bytes",
        )


def _check_dataset_sizes(cfg: DictConfig) -> None:
    """``dataset.subset`` and ``dataset.test_subset`` are at most the examples there are, where
    the config says how many (CIFAR-10's, a synthetic set's ``num_train``); any other loader
    checks its own."""
    data = cfg.dataset
    cifar10 = data._target_ in ("grab_exp.data.load_cifar10", "grab_exp.data.load_cifar10_jpeg")
    available = {
        "subset": data.get("num_train") or (CIFAR10_TRAIN if cifar10 else None),
        "test_subset": data.get("num_test") or (CIFAR10_TEST if cifar10 else None),
    }
    for key, size in available.items():
        value = data.get(key)
        if value is not None and size is not None and value > size:
            raise config_error(f"dataset.{key}", value, f"null or an integer in 1..{size}")


def _check_depth(cfg: DictConfig, depth: object, projection_dim: int | None) -> None:
    """``balance.depth``: the tree's ``2^(depth+1) - 1`` accumulators of ``d`` values must fit
    in :data:`MAX_BALANCE_BYTES` (float32; ``d`` is ``projection_dim`` or the model's size)."""
    if isinstance(depth, bool) or not isinstance(depth, int) or depth < 0:
        return  # the ordering's own check names the key
    d = projection_dim or _model_size(cfg)

    def need(k: int) -> int:
        return (2 ** (k + 1) - 1) * d * 4

    if need(depth) > MAX_BALANCE_BYTES:
        deepest = max((k for k in range(64) if need(k) <= MAX_BALANCE_BYTES), default=-1)
        raise config_error(
            "balance.depth",
            depth,
            f"0..{deepest} (depth {depth} keeps 2^{depth + 1}-1 accumulators of {d} values: "
            f"{need(depth) / 2**30:.3g} GiB; at most {MAX_BALANCE_BYTES / 2**30:.0f} GiB)",
        )


def _check_single_balance(cfg: DictConfig, cls: type[Ordering]) -> None:
    """Build the ordering on a tiny problem: its constructor checks every option.

    ``balance.projection_dim`` is checked against the model's real ``d`` (it must be < d), and
    an ordering that balances within mini-batches must see the run's own batch size.
    """
    options = _options(cfg.balance)
    cls.check_options(options)
    if "depth" in options:
        _check_depth(cfg, options["depth"], options.get("projection_dim"))
    if "batch_size" in options:
        if options["batch_size"] != cfg.batch_size:
            raise config_error(
                "balance.batch_size", options["batch_size"], "the run's batch_size (${batch_size})"
            )
        check_power_of_two("batch_size", cfg.batch_size)
    d = 1 if options.get("projection_dim") is None or not cls.needs_grads else _model_size(cfg)
    cls(max(2, cfg.batch_size), d, **options)
    if cls.needs_grads:
        free = ", ".join(sorted(n for n, c in Ordering.choices().items() if not c.needs_grads))
        _check_per_sample(cfg, f"balance {cls.name}", f"; or with it a balance of: {free}")


def _check_distributed_balance(cfg: DictConfig, cls: type[DistributedOrdering]) -> None:
    if cls.name == "cd_grab" and cfg.batch_size % 2:
        raise config_error("batch_size", cfg.batch_size, "an even number with balance cd_grab")
    if cls.needs_grads:
        _check_per_sample(cfg, f"balance {cls.name}")


def _check_balance(cfg: DictConfig) -> None:
    """The ordering fits the job: single-process orderings alone, distributed ones with workers."""
    cls = _class_of(cfg, "balance")
    if cfg.distributed.enabled or cfg.distributed.simulate_workers:
        if not (isinstance(cls, type) and issubclass(cls, DistributedOrdering)):
            allowed = ", ".join(sorted(Ordering.choices(distributed=True)))
            raise config_error(
                "balance", option_name(cfg, "balance"), f"{allowed} with distributed"
            )
        _check_distributed_balance(cfg, cls)
        return
    if not (isinstance(cls, type) and issubclass(cls, Ordering) and not cls.distributed):
        allowed = ", ".join(sorted(Ordering.choices()))
        hint = " (or distributed=true for a data-parallel ordering)"
        raise config_error("balance", option_name(cfg, "balance"), allowed + hint)
    _check_single_balance(cfg, cls)


def _check_dataset(cfg: DictConfig) -> None:
    """The data can be had: on disk, or (``dataset=cifar10``) from its server; nothing is read.

    The loader's own check (:data:`grab_exp.data.AVAILABILITY_CHECKS`) names the ways forward.
    """
    from grab_exp.data import AVAILABILITY_CHECKS

    try:
        loader = _locate(cfg.dataset._target_)  # get_method would also log Hydra's own block
    except ImportError as error:
        raise ConfigError(import_error_line("dataset", cfg.dataset._target_, error)) from error
    check = AVAILABILITY_CHECKS.get(loader)
    if check is not None:
        try:
            check(**_options(cfg.dataset))
        except RuntimeError as error:  # CIFAR-10 neither on disk nor downloadable
            raise ConfigError(str(error)) from error


def _check_compile(cfg: DictConfig) -> None:
    method = cfg.pipeline.get("method")
    if cfg.trainer.compile and method is not None and method not in COMPILABLE_METHODS:
        raise config_error(
            "pipeline.method",
            method,
            f"{', '.join(COMPILABLE_METHODS)} with trainer.compile=true (the hook path's "
            "per-layer hooks break torch.compile's graph at every layer; loop runs one example "
            "at a time in Python)",
        )


def _check_batch_size(cfg: DictConfig) -> None:
    """``batch_size`` is at most the examples of one worker (the whole training set alone)."""
    data = cfg.dataset
    n = data.get("subset") or data.get("num_train") or CIFAR10_TRAIN
    workers = cfg.distributed.simulate_workers or cfg.distributed.workers or 1
    if cfg.batch_size > n // workers:
        where = "the training set size" if workers == 1 else f"the examples of each of {workers}"
        raise config_error("batch_size", cfg.batch_size, f"an integer <= {n // workers} ({where})")


def _check_device(cfg: DictConfig) -> None:
    """``cuda`` needs CUDA, and ``cuda:k`` one of the GPUs visible here."""
    if not cfg.device.startswith("cuda"):
        return
    if not torch.cuda.is_available():
        raise config_error("device", cfg.device, "auto, cpu (CUDA is not available)")
    count = torch.cuda.device_count()
    if torch.device(cfg.device).index not in (None, *range(count)):
        raise config_error("device", cfg.device, f"cuda, cuda:0 .. cuda:{count - 1}")


def _check_cuda_graph(cfg: DictConfig) -> None:
    """``trainer.cuda_graph`` needs one process, eager gradients, a step whose shape is the same
    at every full batch (pair balance: an even ``batch_size``), and CUDA."""
    if not cfg.trainer.cuda_graph:
        return
    if cfg.distributed.enabled or cfg.distributed.simulate_workers:
        raise config_error("trainer.cuda_graph", True, "false with distributed training")
    if cfg.trainer.compile:
        raise config_error(
            "trainer.cuda_graph", True, "false with trainer.compile=true (compile_mode "
            "reduce-overhead makes CUDA graphs of its own)",
        )  # fmt: skip
    ordering = _class_of(cfg, "balance")
    allowed = ordering.capture_batch_sizes(cfg.batch_size)
    if allowed is not None:
        where = f"with balance={ordering.name} and trainer.cuda_graph=true"
        raise config_error("batch_size", cfg.batch_size, f"{allowed} {where}")
    if not (cfg.device.startswith("cuda") or (cfg.device == "auto" and torch.cuda.is_available())):
        raise config_error(
            "trainer.cuda_graph",
            True,
            f"false with device={cfg.device} (a CUDA graph needs CUDA; the CPU's traced replay, "
            "grab_exp.trace.TracedStep, tests capture and is no faster overall)",
        )


#: the dataset last: its check may ask the download server (a few seconds when offline)
def _check_loggers(cfg: DictConfig) -> None:
    """Every ``logger.extra`` node names a :class:`~grab_exp.logging.RunLogger` subclass."""
    from grab_exp.logging import logger_problem

    extra = cfg.logger.get("extra") or {}
    for key in extra:
        node = extra[key]
        node = OmegaConf.to_container(node) if isinstance(node, DictConfig) else node
        if (problem := logger_problem(str(key), node)) is not None:
            raise ConfigError(problem)


CHECKS = (check_values, _check_dataset_sizes, _check_batch_size, _check_vrgd, _check_balance)
CHECKS += (_check_compile, _check_device, _check_cuda_graph, _check_model_memory, _check_dataset)


def _check_loss(cfg: DictConfig) -> None:
    """The loss builds, from its options (``loss.label_smoothing`` in range, ...)."""
    loss = instantiate(cfg.loss)
    if not callable(loss):
        raise config_error("loss", type(loss).__name__, "a loss (out, y) -> () (grab_exp.losses)")


CHECKS += (_check_loggers, _check_loss)


def validate_config(cfg: DictConfig) -> None:
    """Check the ranges, choices and cross-field rules of a composed run config.

    Raises:
        ConfigError: one line naming the key and the allowed values.
    """
    try:
        for check in CHECKS:
            check(cfg)
    except ConfigError:
        raise
    except InstantiationException as error:  # a user's model, loss, logger... that failed
        raise ConfigError(target_error_line(error, cfg)) from error
    except (ValueError, TypeError, FileNotFoundError) as error:
        raise ConfigError(str(error).splitlines()[0]) from error


#: (run directory, task overrides) -> the fingerprint of the job config checked for it in this
#: process, until the job takes it (:func:`take_checked`)
_CHECKED: dict[tuple[str, tuple[str, ...]], dict[str, Any]] = {}


def keep_checked(run_dir: Path, task_overrides: Any, fingerprint: dict[str, Any]) -> None:
    """Keep the fingerprint of a job that passed every check before Hydra wrote anything."""
    _CHECKED[str(run_dir), tuple(task_overrides)] = fingerprint


def take_checked(run_dir: Path, task_overrides: Any) -> dict[str, Any] | None:
    """The fingerprint :func:`keep_checked` kept for the job at ``run_dir`` with
    ``task_overrides`` in this process (once: it is forgotten), else ``None``."""
    return _CHECKED.pop((str(run_dir), tuple(task_overrides)), None)
