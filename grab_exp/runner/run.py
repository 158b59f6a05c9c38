"""One job of ``python -m grab_exp``: validate, resume or skip, train, log, checkpoint."""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from grab_exp.logging.files import remove_stale_temp_files
from grab_exp.logging.local import LocalStore
from grab_exp.logging.wandb_logger import build_wandb_logger
from grab_exp.runner.build import build_job, resolve_device
from grab_exp.runner.checkpoint import load_checkpoint, save_checkpoint
from grab_exp.runner.config_check import validate_config
from grab_exp.runner.progress import Progress
from grab_exp.runner.rundir import finished_run, has_artifacts, keep_aside
from grab_exp.runner.trainer import TrainingJob, run_epoch

log = logging.getLogger("grab_exp")


class NonFiniteLossError(RuntimeError):
    """The training loss became NaN or infinite."""


def _variant_names() -> tuple[str, str]:
    choices = HydraConfig.get().runtime.choices
    return choices["balance"], choices["pipeline"]


def _restore(job: TrainingJob, state: dict[str, Any]) -> None:
    job.model.load_state_dict(state["model"])
    job.optimizer.load_state_dict(state["optimizer"])
    job.sampler.load_state_dict(state["sampler"])


def _check_finite(row: dict[str, Any], epoch: int) -> None:
    if not all(math.isfinite(row[k]) for k in ("train/running_loss", "train/loss")):
        raise NonFiniteLossError(
            f"epoch {epoch + 1}: the training loss is {row['train/running_loss']} (not finite); "
            "the run stopped and the last good checkpoint was kept (try a smaller optimizer.lr)"
        )


def _relog_checkpointed(wandb, metrics: list[dict[str, Any]]) -> None:
    """Log a resumed job's checkpointed rows to its continued W&B run again.

    W&B writes asynchronously: a killed attempt may have checkpointed epochs that never reached
    its W&B files. Rows go again from the continued run's first step on (0 offline, where the
    reader merges the attempts; online, W&B knows which steps it already has).
    """
    first_step = getattr(wandb.run, "starting_step", 0)
    for row in metrics:
        if row["epoch"] >= first_step:
            wandb.log(row, row["epoch"])


def _train(cfg: DictConfig, job: TrainingJob, store: LocalStore, run_dir: Path, wandb) -> dict:
    state = load_checkpoint(run_dir)
    metrics: list[dict[str, Any]] = []
    if state is not None:
        _restore(job, state)
        metrics = state["metrics"]
        log.info("resuming %s after epoch %d", run_dir, state["epoch"] + 1)
    store.rewrite(metrics)  # exactly the checkpoint's rows, whatever was written after it
    run_id = (
        wandb.start(
            run_dir, OmegaConf.to_container(cfg, resolve=True), state["wandb_id"] if state else None
        )
        if wandb
        else None
    )
    if wandb and metrics:
        _relog_checkpointed(wandb, metrics)
    progress = Progress(cfg.progress, cfg.epochs)
    for epoch in range(state["epoch"] + 1 if state else 0, cfg.epochs):
        row = run_epoch(job, epoch, progress)
        _check_finite(row, epoch)
        metrics.append(row)
        save_checkpoint(
            run_dir,
            epoch=epoch,
            metrics=metrics,
            wandb_id=run_id,
            model=job.model.state_dict(),
            optimizer=job.optimizer.state_dict(),
            sampler=job.sampler.state_dict(),
        )
        store.append(row)
        if wandb:
            wandb.log(row, row["epoch"])
        store.write_summary("running", final=row)
    return metrics[-1] if metrics else {}


def run_job(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume, or skip) the job that ``cfg`` describes; return its final metrics."""
    from grab_exp.distributed.hydra_job import is_distributed, run_distributed_job

    if is_distributed(cfg):  # checks its own orderings (d_rr, d_grab, cd_grab)
        return run_distributed_job(cfg)
    validate_config(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    if (final := finished_run(run_dir, cfg.overwrite)) is not None:
        return final
    if cfg.overwrite and has_artifacts(run_dir):
        keep_aside(run_dir)
    remove_stale_temp_files(run_dir)  # a kill during an atomic write leaves its temp file
    device = resolve_device(cfg.device)
    started = time.time()
    data = instantiate(cfg.dataset).to(device)
    job = build_job(cfg, data, device)
    store = LocalStore(run_dir, job.metric_columns)
    balance, pipeline = _variant_names()
    wandb = build_wandb_logger(
        cfg.logger.wandb, group=cfg.name, name=f"{balance}-{pipeline}-seed{cfg.seed}"
    )
    store.write_summary(
        "running",
        device=str(device),
        variant=balance,
        pipeline=pipeline,
        seed=cfg.seed,
    )
    status, final = "failed", {}
    try:
        final = _train(cfg, job, store, run_dir, wandb)
        status = "finished"
        return final
    finally:
        fields = {"final": final} if final else {}
        store.write_summary(status, wall_time_s=time.time() - started, **fields)
        if wandb:
            wandb.finish(0 if status == "finished" else 1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
