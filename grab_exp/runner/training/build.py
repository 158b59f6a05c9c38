"""Build the objects of a job from its composed config: model, optimizer, ordering, pipeline."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from hydra.utils import get_class, instantiate
from omegaconf import DictConfig
from torch.nn import functional as F

from grab_exp.data import ArrayData
from grab_exp.optim import CLIP_HIGH, CLIP_LOW, GSNROptimizer
from grab_exp.runner.config.schema import ConfigError
from grab_exp.runner.training.capture import CapturedStep, capture_step
from grab_exp.runner.training.step import StepParts
from grab_exp.runner.training.strategy import Strategy

TRAINING_COLUMNS = (  # what every job logs per epoch
    "epoch",
    "train/loss",
    "train/acc",
    "test/loss",
    "test/acc",
    "train/running_loss",
    "time/epoch_s",
    "mem/peak_cuda_mb",
    "mem/step_peak_cuda_mb",
    "mem/peak_rss_mb",
    "mem/sorter_bytes",  # the ordering's state; the name committed runs and W&B projects use
)
GSNR_COLUMNS = (CLIP_LOW, CLIP_HIGH)  # only for VRGD optimizers


@dataclass
class TrainingJob:
    """Everything one job trains with (data already on the strategy's device)."""

    parts: StepParts
    data: ArrayData
    strategy: Strategy
    batch_size: int
    eval_batch_size: int
    captured: CapturedStep | None = None  # ``trainer.cuda_graph``: full batches replay it

    @property
    def metric_columns(self) -> tuple[str, ...]:
        """The columns of this job's metrics.csv."""
        gsnr = GSNR_COLUMNS if self.parts.uses_gsnr else ()
        return TRAINING_COLUMNS + self.strategy.extra_columns + gsnr


def compile_mode(cfg: DictConfig) -> str | None:
    """``trainer.compile_mode`` when ``trainer.compile`` is true, else ``None`` (eager)."""
    return cfg.trainer.compile_mode if cfg.trainer.compile else None


def build_parts(cfg: DictConfig, n: int, strategy: Strategy) -> StepParts:
    """Model (seeded init), optimizer, ordering of ``n`` examples and pipeline of ``cfg``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = instantiate(cfg.model).to(strategy.device)
    optimizer = instantiate(cfg.optimizer)(model.parameters())
    if isinstance(optimizer, GSNROptimizer):  # every batch (the last, short one too) splits
        try:
            optimizer.check_batches(cfg.batch_size, n)
        except ValueError as error:
            raise ConfigError(str(error)) from error
    d = sum(p.numel() for p in model.parameters() if p.requires_grad)
    ordering = strategy.make_ordering(instantiate(cfg.balance), n, d, cfg.seed)
    make_pipeline = instantiate(cfg.pipeline)
    per_sample = get_class(cfg.pipeline._target_).provides_per_sample
    options = {"factors": ordering.takes_factors} if per_sample else {}
    pipeline = make_pipeline(
        model=model, loss_fn=F.cross_entropy, compile_mode=compile_mode(cfg), **options
    )
    return StepParts(model, optimizer, pipeline, ordering, strategy.gradient_reducer(model))


def build_job(cfg: DictConfig, data: ArrayData, strategy: Strategy) -> TrainingJob:
    """The step's parts (:func:`build_parts`) for ``data``, captured with ``trainer.cuda_graph``."""
    parts = build_parts(cfg, len(data.train_y), strategy)
    captured = capture_step(parts) if cfg.trainer.cuda_graph else None
    return TrainingJob(parts, data, strategy, cfg.batch_size, cfg.eval_batch_size, captured)
