"""The path of one job of ``python -m grab_exp``, every kind of job, read top to bottom.

validate (once: a job that Hydra's callback or the sweep checked in this process is not checked
again) -> connect (one process, simulated or torchrun workers) -> lock the run directory
(rank 0) -> resolve it (skip a finished run, resume an interrupted one, or keep an old one
aside) -> build -> train epochs, each checkpointed atomically and logged -> final summary, also
on failure or on a stop signal (status ``interrupted``) -> unlock. :func:`run_job` comes first,
each helper after the function that calls it.
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any

import torch
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from grab_exp.distributed.comm import CollectiveError, exit_after_collective_error
from grab_exp.logging.build import build_loggers
from grab_exp.logging.files import WriteError, remove_stale_temp_files, shown
from grab_exp.logging.guard import GuardedLogger
from grab_exp.logging.local import LocalStore
from grab_exp.runner.config.check import take_checked, validate_config
from grab_exp.runner.config.fingerprint import check_same_config, config_fingerprint
from grab_exp.runner.config.user_dirs import replaced_options
from grab_exp.runner.rundir.checkpoint import (
    CHECKPOINT_NAME,
    load_checkpoint,
    logger_ids,
    merged_logger_ids,
    save_checkpoint,
)
from grab_exp.runner.rundir.identity import run_identity
from grab_exp.runner.rundir.lock import RunDirInUseError, RunLock, holder
from grab_exp.runner.rundir.state import finished_run, has_artifacts, keep_aside
from grab_exp.runner.training.build import TrainingJob, build_job
from grab_exp.runner.training.connect import connect
from grab_exp.runner.training.epoch import run_epoch
from grab_exp.runner.training.errors import NonFiniteLossError, error_record
from grab_exp.runner.training.load import load_dataset
from grab_exp.runner.training.progress import Progress
from grab_exp.runner.training.signals import check_stop, stop_on_signals, stop_requested
from grab_exp.runner.training.strategy import Strategy, check_checkpoint_kind

log = logging.getLogger("grab_exp")
#: what a skipped finished run says to a command with logger=wandb
UPLOAD_LINE = (
    "a finished run is not logged again; python -m grab_exp.logging upload {} puts it into W&B"
)


def run_job(cfg: DictConfig) -> dict[str, Any]:
    """Run (or resume, or skip) the job that ``cfg`` describes; return its final metrics.

    A failed collective (a dead or hung peer) ends the process with one ``error: ...`` line
    and status 1, after rank 0 marked the run ``failed``.

    Raises:
        RunDirInUseError: another live job holds the run directory.
        JobInterrupted: SIGTERM or SIGINT stopped the job at a step boundary; the run is
            ``interrupted`` and the same command resumes it from its last checkpoint.
    """
    fingerprint = _checked_fingerprint(cfg)
    run_dir = Path(HydraConfig.get().runtime.output_dir)
    with stop_on_signals():
        strategy = connect(cfg)
        try:
            lock = _lock(run_dir, strategy)
            try:
                return _run(cfg, strategy, run_dir, fingerprint)
            finally:
                if lock:
                    lock.release()
        except CollectiveError as error:
            check_stop()  # a peer stopped on the same signal first: interrupted, not failed
            exit_after_collective_error(error)


def _checked_fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """The job's fingerprint, validated: by Hydra's callback or the sweep's check (which a local
    launcher hands on with the job's config), else here (a caller outside the command line, a
    job that SLURM or a plugin's launcher runs elsewhere)."""
    if HydraConfig.initialized():
        hydra = HydraConfig.get()
        if checked := take_checked(Path(hydra.runtime.output_dir), hydra.overrides.task):
            return checked
    validate_config(cfg)
    return config_fingerprint(cfg)


def _lock(run_dir: Path, strategy: Strategy) -> RunLock | None:
    """Rank 0 (the writer) locks ``run_dir``; every rank learns whether it could.

    Raises:
        RunDirInUseError: another live job holds the directory (on every rank).
    """
    lock, refusal = (RunLock(run_dir), None) if strategy.is_writer else (None, None)
    if lock:
        try:
            lock.acquire()
        except RunDirInUseError as error:
            refusal = str(error)
    refusal = strategy.from_writer(refusal, "run directory lock")
    if refusal:
        raise RunDirInUseError(refusal)
    return lock


def _run(cfg: DictConfig, strategy: Strategy, run_dir: Path, fingerprint: dict) -> dict[str, Any]:
    if (final := finished_run(run_dir, cfg.overwrite, fingerprint["config"])) is not None:
        _skipped(cfg, strategy, run_dir)
        return final
    started = time.time()
    choice = HydraConfig.get().runtime.choices.get("dataset")
    job = build_job(cfg, load_dataset(cfg, strategy.device, choice), strategy)  # or refused
    _prepare_run_dir(run_dir, cfg, strategy)
    identity = run_identity(cfg, strategy.world_size)
    store = LocalStore(run_dir, job.metric_columns) if strategy.is_writer else None
    loggers: list[GuardedLogger] = []
    if strategy.is_writer:
        name = strategy.run_name(identity["variant"], identity["pipeline"], cfg.seed)
        built = build_loggers(cfg.logger, group=cfg.name, name=name)
        loggers = [GuardedLogger(key, each, stop_requested) for key, each in built.items()]
        store.write_summary(
            "running",
            identity=identity,
            device=str(strategy.device),
            variant=identity["variant"],
            pipeline=identity["pipeline"],
            seed=cfg.seed,
            config_fingerprint=fingerprint,
            **{key: holder()[key] for key in ("pid", "host")},
            **strategy.summary_fields(),
        )
    strategy.log_start(job.parts.ordering)
    if strategy.is_writer:
        log.info("%s", job_line(cfg, job, identity))
    status, final, failure = "failed", {}, {}
    try:
        final = _train(cfg, job, run_dir, store, loggers, identity, fingerprint["config"])
        status = "finished"
        if strategy.is_writer and final:
            log.info("%s", end_line(final, time.time() - started, run_dir))
        return final
    except BaseException as error:
        status = "interrupted" if stop_requested() else "failed"
        if status == "failed" and strategy.is_writer:
            failure = {"error": error_record(error)}
            log.error("failed: %s", failure["error"]["message"])
        raise
    finally:
        ended = {"wall_time_s": time.time() - started, **({"final": final} if final else {})}
        if store:
            _end_summary(store, status, **ended, **failure)
        for logger in loggers:
            logger.finish(status, ended)
        if strategy.device.type == "cuda":
            torch.cuda.empty_cache()


def _skipped(cfg: DictConfig, strategy: Strategy, run_dir: Path) -> None:
    """Say how a skipped finished run gets into W&B when the command asks for W&B."""
    if cfg.logger.wandb.enabled and strategy.is_writer:  # nothing trains, nothing is logged
        log.info("logger=wandb: %s", UPLOAD_LINE.format(shown(run_dir)))


def _prepare_run_dir(run_dir: Path, cfg: DictConfig, strategy: Strategy) -> None:
    if strategy.is_writer:
        if cfg.overwrite and has_artifacts(run_dir):
            keep_aside(run_dir)
        remove_stale_temp_files(run_dir)  # a kill during an atomic write leaves its temp file
        state = "resumed" if (run_dir / CHECKPOINT_NAME).exists() else "new"
        log.info("run directory: %s (%s)", shown(run_dir), state)
    strategy.barrier("run directory ready")


def _train(
    cfg: DictConfig,
    job: TrainingJob,
    run_dir: Path,
    store: LocalStore | None,
    loggers: list[GuardedLogger],
    identity: dict,
    config: dict,
) -> dict[str, Any]:
    state = load_checkpoint(run_dir)
    if state and "config" in state:  # one from before fingerprints: summary.json's check said so
        check_same_config(run_dir, state["config"], config, CHECKPOINT_NAME)
    metrics = _restore(job, state) if state else []
    if state and store:
        log.info("resuming after epoch %d", state["epoch"] + 1)
    if store:
        store.rewrite(metrics)  # exactly the checkpoint's rows, whatever was written after it
    ids = logger_ids(state) if state else {}
    if loggers:  # the loggers get the nested config; the checkpoint keeps the job's flat one
        nested = {**OmegaConf.to_container(cfg, resolve=True), "identity": identity}
        started = {
            each.name: each.start(run_dir, nested, ids.get(each.name), metrics) for each in loggers
        }
        ids = merged_logger_ids(ids, started)
        if store:  # what an upload reads to recognise a run that W&B has already
            store.write_summary("running", logger_ids=ids)
    progress = Progress(cfg.progress if store else "none", cfg.epochs)
    for epoch in range(state["epoch"] + 1 if state else 0, cfg.epochs):
        check_stop()
        row = run_epoch(job, epoch, progress)
        _check_finite(row, epoch)
        metrics.append(row)
        _save(run_dir, job, epoch, metrics, ids, config)
        if store:
            store.append(row)
            store.write_summary("running", final=row)
        for logger in loggers:
            logger.log(row, row["epoch"])
    return metrics[-1] if metrics else {}


def _restore(job: TrainingJob, state: dict[str, Any]) -> list[dict[str, Any]]:
    check_checkpoint_kind(job.strategy, state)
    job.parts.model.load_state_dict(state["model"])
    job.parts.optimizer.load_state_dict(state["optimizer"])
    job.strategy.load_ordering_state(job.parts.ordering, state)
    return state["metrics"]


def _check_finite(row: dict[str, Any], epoch: int) -> None:
    if not all(math.isfinite(row[k]) for k in ("train/running_loss", "train/loss")):
        kept = (
            f"its checkpoint of epoch {epoch} was kept"
            if epoch
            else "no epoch finished, so there is no checkpoint"
        )
        raise NonFiniteLossError(
            f"epoch {epoch + 1}: the training loss is {row['train/running_loss']} (not finite); "
            f"the run stopped and {kept} (try a smaller optimizer.lr)"
        )


def _save(
    run_dir: Path, job: TrainingJob, epoch: int, metrics: list, ids: dict, config: dict
) -> None:
    ordering = job.strategy.ordering_state(job.parts.ordering)  # collective when data-parallel
    if job.strategy.is_writer:
        save_checkpoint(
            run_dir,
            config=config,
            strategy=job.strategy.kind,
            world_size=job.strategy.world_size,
            device_type=job.strategy.device.type,
            epoch=epoch,
            metrics=metrics,
            logger_ids=ids,
            model=job.parts.model.state_dict(),
            optimizer=job.parts.optimizer.state_dict(),
            ordering=ordering,
        )


def _end_summary(store: LocalStore, status: str, **fields: Any) -> None:
    """The final summary; when it cannot be written (a full disk) only a finished run fails,
    any other keeps the error that ended it."""
    try:
        store.write_summary(status, **fields)
    except WriteError as error:
        log.error("%s", error)
        if status == "finished":
            raise


def job_line(cfg: DictConfig, job: TrainingJob, identity: dict[str, Any]) -> str:
    """The job in words, logged when it starts: ordering, model (its class: a ``model._target_``
    of the user's shows), dataset, epochs, device, and the user's files (``--config-dir``) that
    replace ours of the same name."""
    runtime = HydraConfig.get().runtime
    choices = runtime.choices
    data, model = job.data, job.parts.model
    name = type(getattr(model, "_orig_mod", model)).__name__  # compiled: the model's own class
    parameters = sum(p.numel() for p in model.parameters() if p.requires_grad)
    replaced = replaced_options(choices, runtime.config_sources)
    epochs = f"{cfg.epochs} epoch{'s' * (cfg.epochs != 1)}"
    return (
        f"job: ordering {identity['variant']} ({identity['pipeline']} pipeline), model "
        f"{name} ({parameters:,} parameters), dataset {choices.get('dataset')} "
        f"({len(data.train_y):,} train / {len(data.test_y):,} test), {epochs} of "
        f"batch {cfg.batch_size}, seed {cfg.seed}, device {job.strategy.device}"
        + "".join(f"; {path} replaces ours" for path in replaced)
    )


def end_line(final: dict[str, Any], seconds: float, run_dir: Path) -> str:
    """The job's last line: its final ``train/loss`` and ``test/acc``, wall time, directory."""
    minutes, rest = divmod(round(seconds), 60)
    wall = f"{minutes}m {rest:02d}s" if minutes else f"{seconds:.1f}s"
    return (
        f"finished after epoch {final['epoch']}: train/loss {final['train/loss']:.4f}  "
        f"test/acc {final['test/acc']:.4f}  wall time {wall}; results in {shown(run_dir)}"
    )
