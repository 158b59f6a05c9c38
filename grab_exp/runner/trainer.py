"""One training epoch and its metrics; the hot loop has no host synchronization."""

from __future__ import annotations

import resource
import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from grab_exp.data import ArrayData
from grab_exp.optim import CLIP_HIGH, CLIP_LOW, GSNROptimizer
from grab_exp.runner.evaluate import evaluate
from grab_exp.runner.progress import Progress
from grab_exp.sampler import GraBSampler

TRAINING_COLUMNS = (  # what every runner logs per epoch, the distributed one too
    "epoch",
    "train/loss",
    "train/acc",
    "test/loss",
    "test/acc",
    "train/running_loss",
    "time/epoch_s",
)
METRIC_COLUMNS = (
    *TRAINING_COLUMNS,
    "mem/peak_cuda_mb",
    "mem/peak_rss_mb",
    "mem/sorter_bytes",
)
GSNR_COLUMNS = (CLIP_LOW, CLIP_HIGH)  # only for VRGD optimizers


@dataclass
class TrainingJob:
    """Everything one run trains with (data already on ``device``)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    sampler: GraBSampler
    pipeline: Any
    data: ArrayData
    batch_size: int
    eval_batch_size: int
    device: torch.device

    @property
    def uses_gsnr(self) -> bool:
        """Whether the optimizer scales its steps by the GSNR (VRGD)."""
        return isinstance(self.optimizer, GSNROptimizer)

    @property
    def metric_columns(self) -> tuple[str, ...]:
        """The columns of this job's metrics.csv."""
        return METRIC_COLUMNS + (GSNR_COLUMNS if self.uses_gsnr else ())


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def train_steps(job: TrainingJob, progress: Progress) -> torch.Tensor:
    """One pass over the sampler's order; returns the summed mini-batch loss (device)."""
    loss_sum = torch.zeros((), device=job.device)
    needs_grads = job.sampler.balance.needs_grads
    uses_gsnr = job.uses_gsnr
    for indices in job.sampler.index_batches(job.batch_size):
        x, y = job.data.train_x[indices], job.data.train_y[indices]  # (B, 3, 32, 32), (B,)
        job.optimizer.zero_grad(set_to_none=True)
        loss, grads = job.pipeline(x, y)
        if uses_gsnr:
            job.optimizer.observe(grads)  # this batch's GSNR, before the ordering sees grads
        job.sampler.step(grads if needs_grads else None, indices)
        job.optimizer.step()
        loss_sum += loss
        progress.step(loss)
    return loss_sum


def run_epoch(job: TrainingJob, epoch: int, progress: Progress) -> dict[str, Any]:
    """Train epoch ``epoch`` (0-based), then evaluate; returns the epoch's metrics row.

    The row's ``epoch`` is the number of completed epochs (``epoch + 1``).
    """
    job.sampler.set_epoch(epoch)
    if job.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(job.device)
    _synchronize(job.device)
    started = time.perf_counter()
    progress.start_epoch(epoch, -(-len(job.sampler) // job.batch_size))
    loss_sum = train_steps(job, progress)
    _synchronize(job.device)
    seconds = time.perf_counter() - started
    peak_cuda = (
        torch.cuda.max_memory_allocated(job.device) / 2**20 if job.device.type == "cuda" else None
    )
    train_loss, train_acc = evaluate(
        job.model, job.data.train_x, job.data.train_y, job.eval_batch_size
    )
    test_loss, test_acc = evaluate(job.model, job.data.test_x, job.data.test_y, job.eval_batch_size)
    steps = -(-len(job.sampler) // job.batch_size)
    row = {
        "epoch": epoch + 1,
        "train/loss": train_loss.item(),
        "train/acc": train_acc.item(),
        "test/loss": test_loss.item(),
        "test/acc": test_acc.item(),
        "train/running_loss": loss_sum.item() / steps,
        "time/epoch_s": seconds,
        "mem/peak_cuda_mb": peak_cuda,
        "mem/peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "mem/sorter_bytes": job.sampler.balance.state_bytes(),
    }
    if job.uses_gsnr:
        row.update(job.optimizer.clip_fractions())  # one host read; resets the counters
    progress.end_epoch(row)
    return row
