"""Data-parallel training with a distributed ordering.

Every worker trains on its own shard: per step each process computes the per-sample
gradients of its local mini-batch(es), hands them to the ordering, averages the mean gradient
over the processes with one all-reduce and takes the same optimizer step, so all processes
hold identical models (checked by a float64 parameter checksum every epoch). The simulator
runs all ``W`` workers in one process on one model: its mean over the ``W B`` examples of a
step is the average of the workers' means.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from grab_exp.data import ArrayData
from grab_exp.distributed.comm import Communicator
from grab_exp.distributed.orderings import DistributedOrdering
from grab_exp.runner.evaluate import evaluate
from grab_exp.runner.trainer import TRAINING_COLUMNS

METRIC_COLUMNS = (
    *TRAINING_COLUMNS,
    "comm/bytes_per_step",
    "comm/bytes_epoch",
    "check/param_checksum",
)


class ModelDivergenceError(RuntimeError):
    """The processes' models are no longer identical."""


@dataclass
class DataParallelJob:
    """One process's share of a data-parallel run (data already on ``device``).

    Attributes:
        batch_size: examples per worker per step (``B``; even for ``cd_grab``).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    ordering: DistributedOrdering
    pipeline: Any
    data: ArrayData
    batch_size: int
    comm: Communicator
    eval_batch_size: int = 1000


def average_gradients_(model: nn.Module, comm: Communicator) -> None:
    """Average every ``param.grad`` over the processes with one flat all-reduce."""
    if comm.processes == 1:
        return
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])  # (d,)
    comm.all_reduce_mean_(flat, name="gradient all-reduce")
    for grad, part in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
        grad.copy_(part.view_as(grad))


def parameter_checksum(model: nn.Module) -> torch.Tensor:
    """``(3,)`` float64: sum, sum of squares and a position-weighted sum of all parameters."""
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])  # (D,)
    weights = torch.linspace(1.0, 2.0, len(flat), dtype=torch.float64, device=flat.device)
    return torch.stack([flat.sum(), flat.square().sum(), flat.dot(weights)])


def check_identical_models(model: nn.Module, comm: Communicator) -> torch.Tensor:
    """All-gather the checksums and raise unless every process has the same model.

    Returns:
        ``(3,)`` this process's checksum.

    Raises:
        ModelDivergenceError: naming the ranks whose checksum differs from rank 0's.
    """
    mine = parameter_checksum(model)
    if comm.processes == 1:
        return mine
    every = comm.all_gather(mine[None], name="parameter checksum")  # (W, 3)
    bad = (every != every[0]).any(dim=1).nonzero().flatten().tolist()
    if bad:
        raise ModelDivergenceError(f"models differ from rank 0's on ranks {bad}: {every.tolist()}")
    return mine


def train_steps(job: DataParallelJob) -> tuple[torch.Tensor, int]:
    """One pass over every worker's order; returns (summed step loss, steps)."""
    loss_sum = torch.zeros((), device=job.data.train_y.device)
    steps = 0
    for batch in job.ordering.index_batches(job.batch_size):  # (L, B)
        indices = batch.reshape(-1)  # worker-major
        x, y = job.data.train_x[indices], job.data.train_y[indices]
        job.optimizer.zero_grad(set_to_none=True)
        loss, grads = job.pipeline(x, y)
        job.ordering.step(grads if job.ordering.needs_grads else None)
        average_gradients_(job.model, job.comm)
        job.optimizer.step()
        loss_sum += loss
        steps += 1
    return loss_sum, steps


def evaluate_shared(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, comm: Communicator
) -> tuple[float, float]:
    """Mean loss and accuracy on a whole split, each process evaluating a slice of it."""
    bounds = [len(x) * p // comm.processes for p in range(comm.processes + 1)]
    part = slice(bounds[comm.rank], bounds[comm.rank + 1])
    count = part.stop - part.start
    stats = torch.zeros(2, dtype=torch.float64, device=x.device)
    if count:
        loss, acc = evaluate(model, x[part], y[part], batch_size)
        stats = torch.stack([loss * count, acc * count]).double()
    comm.all_reduce_sum_(stats, name="evaluation sums")
    loss_mean, acc_mean = (stats / len(x)).tolist()
    return loss_mean, acc_mean


def run_epoch(job: DataParallelJob, epoch: int) -> dict[str, Any]:
    """Train epoch ``epoch`` (0-based), check the models, evaluate; return the metrics row."""
    job.ordering.set_epoch(epoch)
    sent_before = job.ordering.bytes_sent
    started = time.perf_counter()
    loss_sum, steps = train_steps(job)
    running = job.comm.all_reduce_mean_(loss_sum.double() / max(steps, 1), name="loss")
    checksum = check_identical_models(job.model, job.comm)
    seconds = time.perf_counter() - started
    train_loss, train_acc = evaluate_shared(
        job.model, job.data.train_x, job.data.train_y, job.eval_batch_size, job.comm
    )
    test_loss, test_acc = evaluate_shared(
        job.model, job.data.test_x, job.data.test_y, job.eval_batch_size, job.comm
    )
    return {
        "epoch": epoch + 1,
        "train/loss": train_loss,
        "train/acc": train_acc,
        "test/loss": test_loss,
        "test/acc": test_acc,
        "train/running_loss": running.item(),
        "time/epoch_s": seconds,
        "comm/bytes_per_step": (job.ordering.bytes_sent - sent_before) / max(steps, 1),
        "comm/bytes_epoch": job.ordering.bytes_sent - sent_before,
        "check/param_checksum": checksum[2].item(),
    }
