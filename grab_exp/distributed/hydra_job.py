"""``python -m grab_exp distributed=true``: the Hydra runner's data-parallel job.

``run_job`` hands a config with ``distributed`` enabled to :func:`run_distributed_job`
(``torchrun --nproc_per_node=W -m grab_exp distributed=true balance=cd_grab ...``; or
``distributed.simulate_workers=W`` for ``W`` virtual workers in one process). Every rank
composes the same config, so all agree on the run directory; rank 0 alone writes
``metrics.csv``, ``summary.json``, the checkpoint (with every rank's ordering state) and the
W&B run. A resumed job needs the same number of workers.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig, OmegaConf
from torch.nn import functional as F

from grab_exp.distributed.comm import (
    CollectiveError,
    Communicator,
    SimulatedComm,
    exit_after_collective_error,
    init_distributed,
)
from grab_exp.distributed.orderings import DistributedOrdering
from grab_exp.distributed.shards import split_shards
from grab_exp.distributed.train import METRIC_COLUMNS, DataParallelJob, run_epoch
from grab_exp.logging.files import remove_stale_temp_files
from grab_exp.logging.local import LocalStore
from grab_exp.logging.wandb_logger import build_wandb_logger
from grab_exp.runner.build import compile_mode, resolve_device
from grab_exp.runner.checkpoint import load_checkpoint, save_checkpoint
from grab_exp.runner.config_check import ConfigError, check_trainer
from grab_exp.runner.rundir import finished_run, has_artifacts, keep_aside
from grab_exp.validation import check_choice, check_int_at_least, check_positive

log = logging.getLogger("grab_exp")
OPTION_DEFAULTS = {
    "enabled": False,  # true: data-parallel over torchrun's processes
    "simulate_workers": 0,  # W > 0: W virtual workers in this one process (implies enabled)
    "workers": None,  # expected world size (checked; puts W into the run directory's hash)
    "backend": "auto",  # auto (nccl with CUDA, else gloo) | gloo | nccl
    "timeout_s": 300.0,  # rendezvous and per-collective timeout
}


def distributed_options(cfg: DictConfig) -> dict[str, Any]:
    """The ``distributed`` node with defaults; ``distributed=true`` (a bool) is accepted too."""
    node = cfg.get("distributed", False)
    if node is None or isinstance(node, bool):
        given = {"enabled": bool(node)}
    else:
        given = OmegaConf.to_container(node, resolve=True)
        unknown = sorted(set(given) - set(OPTION_DEFAULTS))
        if unknown:
            raise ConfigError(
                f"distributed: unknown keys {unknown}; allowed: {list(OPTION_DEFAULTS)}"
            )
    options = {**OPTION_DEFAULTS, **given}
    try:
        check_int_at_least("distributed.simulate_workers", options["simulate_workers"], 0)
        check_choice("distributed.backend", options["backend"], ("auto", "gloo", "nccl"))
        check_positive("distributed.timeout_s", options["timeout_s"])
    except ValueError as error:
        raise ConfigError(str(error)) from None
    options["enabled"] = bool(options["enabled"]) or options["simulate_workers"] > 0
    return options


def is_distributed(cfg: DictConfig) -> bool:
    """Whether ``cfg`` asks for a data-parallel (or simulated data-parallel) job."""
    return distributed_options(cfg)["enabled"]


def _check_balance(cfg: DictConfig) -> None:
    cls = get_class(cfg.balance._target_)
    if not (isinstance(cls, type) and issubclass(cls, DistributedOrdering)):
        allowed = ", ".join(sorted(DistributedOrdering.registry))
        raise ConfigError(f"balance: {cfg.balance._target_} with distributed; allowed: {allowed}")
    if cls.name == "cd_grab" and cfg.batch_size % 2:
        raise ConfigError(f"batch_size: got {cfg.batch_size}; cd_grab needs an even batch size")
    if cls.needs_grads and not get_class(cfg.pipeline._target_).provides_per_sample:
        raise ConfigError(f"pipeline: {cls.name} needs per-sample gradients (pipeline=functional)")


def _check_trainer(cfg: DictConfig) -> None:
    try:
        check_trainer(cfg)  # trainer.compile applies to every worker's pipeline
    except ValueError as error:
        raise ConfigError(str(error)) from None


def _connect(options: dict[str, Any], device: str) -> tuple[Communicator, torch.device]:
    if options["simulate_workers"]:
        return SimulatedComm(options["simulate_workers"]), resolve_device(device)
    comm, rank_device = init_distributed(options["backend"], options["timeout_s"])
    if options["workers"] is not None and options["workers"] != comm.world_size:
        raise ConfigError(
            f"distributed.workers: got {options['workers']}; torchrun started "
            f"{comm.world_size} processes"
        )
    return comm, rank_device


def build_job(cfg: DictConfig, comm: Communicator, device: torch.device):
    """This process's :class:`DataParallelJob` and the number of dropped examples."""
    data = instantiate(cfg.dataset).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = instantiate(cfg.model).to(device)
    optimizer = instantiate(cfg.optimizer)(model.parameters())
    d = sum(p.numel() for p in model.parameters() if p.requires_grad)
    split = split_shards(len(data.train_y), comm.world_size, cfg.seed)
    ordering = instantiate(cfg.balance)(
        shards=split.shards, d=d, comm=comm, seed=cfg.seed, device=device
    )
    pipeline = instantiate(cfg.pipeline)(
        model=model, loss_fn=F.cross_entropy, compile_mode=compile_mode(cfg)
    )
    job = DataParallelJob(
        model, optimizer, ordering, pipeline, data, cfg.batch_size, comm, cfg.eval_batch_size
    )
    return job, split.num_dropped


def _restore(job: DataParallelJob, state: dict[str, Any]) -> list[dict[str, Any]]:
    if state["world_size"] != job.comm.world_size:
        raise ConfigError(
            f"distributed: the checkpoint has {state['world_size']} workers, this "
            f"job {job.comm.world_size}; resume with the same number"
        )
    job.model.load_state_dict(state["model"])
    job.optimizer.load_state_dict(state["optimizer"])
    job.ordering.load_state_dict(state["ordering"][job.comm.rank])
    return state["metrics"]


def _save(run_dir: Path, job: DataParallelJob, epoch: int, metrics: list, run_id) -> None:
    orderings = job.comm.gather_objects(job.ordering.state_dict(), name="ordering states")
    if job.comm.rank == 0:
        save_checkpoint(
            run_dir,
            epoch=epoch,
            metrics=metrics,
            wandb_id=run_id,
            world_size=job.comm.world_size,
            model=job.model.state_dict(),
            optimizer=job.optimizer.state_dict(),
            ordering=orderings,
        )


def _train(cfg: DictConfig, job: DataParallelJob, store: LocalStore | None, wandb) -> dict:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    state = load_checkpoint(run_dir)
    metrics = _restore(job, state) if state else []
    if store:
        store.rewrite(metrics)
    run_id = None
    if wandb:
        config = OmegaConf.to_container(cfg, resolve=True)
        run_id = wandb.start(run_dir, config, state["wandb_id"] if state else None)
    for epoch in range(state["epoch"] + 1 if state else 0, cfg.epochs):
        row = run_epoch(job, epoch)
        if not all(math.isfinite(row[k]) for k in ("train/running_loss", "train/loss")):
            raise FloatingPointError(f"epoch {epoch + 1}: the training loss is not finite")
        metrics.append(row)
        _save(run_dir, job, epoch, metrics, run_id)
        if store:
            store.append(row)
            store.write_summary("running", final=row)
            log.info("epoch %d: train/loss %.4f", row["epoch"], row["train/loss"])
        if wandb:
            wandb.log(row, row["epoch"])
    return metrics[-1] if metrics else {}


def _run_job(cfg: DictConfig, options: dict, comm: Communicator, device: torch.device) -> dict:
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if (final := finished_run(run_dir, cfg.overwrite)) is not None:
        return final
    if comm.rank == 0 and cfg.overwrite and has_artifacts(run_dir):
        keep_aside(run_dir)
    if comm.rank == 0:
        remove_stale_temp_files(run_dir)  # a kill during an atomic write leaves its temp file
    comm.barrier(name="run directory ready")
    store = LocalStore(run_dir, METRIC_COLUMNS)
    job, dropped = build_job(cfg, comm, device)
    writer = comm.rank == 0
    balance = HydraConfig.get().runtime.choices["balance"]
    name = f"{balance}-w{comm.world_size}-seed{cfg.seed}"
    wandb = build_wandb_logger(cfg.logger.wandb, group=cfg.name, name=name) if writer else None
    if writer:
        store.write_summary(
            "running",
            device=str(device),
            variant=balance,
            seed=cfg.seed,
            world_size=comm.world_size,
            dropped_examples=dropped,
            simulated=bool(options["simulate_workers"]),
        )
        log.info(
            "%d workers, %d examples each, %d dropped", comm.world_size, job.ordering.m, dropped
        )
    status, final = "failed", {}
    try:
        final = _train(cfg, job, store if writer else None, wandb)
        status = "finished"
        return final
    finally:
        if writer:
            store.write_summary(status, **({"final": final} if final else {}))
        if wandb:
            wandb.finish(0 if status == "finished" else 1)


def run_distributed_job(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume, or skip) this rank's share of a data-parallel job; final metrics.

    A failed collective (a dead or hung peer) ends the process with one ``error: ...`` line
    and status 1, after rank 0 marked the run ``failed`` (see
    :func:`exit_after_collective_error`).
    """
    options = distributed_options(cfg)
    _check_balance(cfg)
    _check_trainer(cfg)
    comm, device = _connect(options, cfg.device)
    try:
        return _run_job(cfg, options, comm, device)
    except CollectiveError as error:
        exit_after_collective_error(error)
