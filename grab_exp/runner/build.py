"""Build the objects of a run from its composed config."""

from __future__ import annotations

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch.nn import functional as F

from grab_exp.data import ArrayData
from grab_exp.optim import GSNROptimizer
from grab_exp.runner.config_check import ConfigError
from grab_exp.runner.trainer import TrainingJob
from grab_exp.sampler import GraBSampler


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; others as given."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    return torch.device(device)


def compile_mode(cfg: DictConfig) -> str | None:
    """``trainer.compile_mode`` when ``trainer.compile`` is true, else ``None`` (eager)."""
    trainer = cfg.get("trainer")
    return trainer.compile_mode if trainer is not None and trainer.compile else None


def build_job(cfg: DictConfig, data: ArrayData, device: torch.device) -> TrainingJob:
    """Model (seeded init), optimizer, ordering, sampler and pipeline for ``data``."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        model = instantiate(cfg.model).to(device)
    optimizer = instantiate(cfg.optimizer)(model.parameters())
    if isinstance(optimizer, GSNROptimizer):  # every batch (the last, short one too) splits
        try:
            optimizer.check_batches(cfg.batch_size, len(data.train_y))
        except ValueError as error:
            raise ConfigError(str(error)) from error
    d = sum(p.numel() for p in model.parameters() if p.requires_grad)
    balance = instantiate(cfg.balance)(n=len(data.train_y), d=d, seed=cfg.seed, device=device)
    pipeline = instantiate(cfg.pipeline)(
        model=model, loss_fn=F.cross_entropy, compile_mode=compile_mode(cfg)
    )
    return TrainingJob(
        model=model,
        optimizer=optimizer,
        sampler=GraBSampler(len(data.train_y), balance=balance),
        pipeline=pipeline,
        data=data,
        batch_size=cfg.batch_size,
        eval_batch_size=cfg.eval_batch_size,
        device=device,
    )
