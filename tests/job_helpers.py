"""Build the runner's real training jobs (Hydra-composed config, synthetic data) in a test."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from config_helpers import compose_config
from hydra.utils import instantiate

from grab_exp.runner.build import build_job
from grab_exp.runner.config_check import validate_config
from grab_exp.runner.progress import Progress
from grab_exp.runner.trainer import TrainingJob, train_steps

# small synthetic CIFAR-shaped data; the run's own model, ordering, pipeline and optimizer
SMALL_RUN = ("experiment=smoke", "dataset.num_test=16", "progress=none")


def compose_job(overrides: Iterable[str], device: str = "cpu") -> TrainingJob:
    """The job ``python -m grab_exp experiment=smoke <overrides>`` would train, on ``device``."""
    cfg = compose_config([*SMALL_RUN, f"device={device}", *overrides])
    validate_config(cfg)
    data = instantiate(cfg.dataset).to(device)
    return build_job(cfg, data, torch.device(device))


class LossRecorder(Progress):
    """A silent progress display that keeps every step's loss ``()`` (device tensors)."""

    def __init__(self) -> None:
        super().__init__("none")
        self.losses: list[torch.Tensor] = []

    def step(self, loss: torch.Tensor) -> None:
        """Keep a copy of the step's loss (no host read)."""
        self.losses.append(loss.detach().clone())


def train_epochs(job: TrainingJob, epochs: int, start: int = 0) -> torch.Tensor:
    """Train epochs ``start .. start + epochs - 1`` with the runner's step loop.

    Returns:
        Every step's loss ``(steps,)``.
    """
    recorder = LossRecorder()
    for epoch in range(start, start + epochs):
        job.sampler.set_epoch(epoch)
        train_steps(job, recorder)
    return torch.stack(recorder.losses)
