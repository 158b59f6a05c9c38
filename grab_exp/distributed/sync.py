"""Keeping data-parallel workers in step: gradient averaging, model checks, shared evaluation.

Every worker computes the mean gradient of its own mini-batch; one all-reduce averages them, so
all processes take the same optimizer step and hold identical models (checked by a float64
parameter checksum every epoch). The simulator runs all ``W`` workers in one process on one
model: its mean over the ``W B`` examples of a step is the average of the workers' means.
"""

from __future__ import annotations

import torch
from torch import nn

from grab_exp.distributed.comm import Communicator
from grab_exp.models.evaluate import Total, cross_entropy_total, evaluate


class ModelDivergenceError(RuntimeError):
    """The processes' models are no longer identical."""


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


def evaluate_shared(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    comm: Communicator,
    total: Total = cross_entropy_total,
) -> tuple[float, float]:
    """Mean loss and accuracy on a whole split, each process evaluating a slice of it."""
    bounds = [len(x) * p // comm.processes for p in range(comm.processes + 1)]
    part = slice(bounds[comm.rank], bounds[comm.rank + 1])
    count = part.stop - part.start
    stats = torch.zeros(2, dtype=torch.float64, device=x.device)
    if count:
        loss, acc = evaluate(model, x[part], y[part], batch_size, total)
        stats = torch.stack([loss * count, acc * count]).double()
    comm.all_reduce_sum_(stats, name="evaluation sums")
    loss_mean, acc_mean = (stats / len(x)).tolist()
    return loss_mean, acc_mean
