"""The training step: the one place outside ``grab_exp/optim`` that steps an optimizer.

Every job (single process, data-parallel, simulated workers) and ``python -m grab_exp.bench
epoch`` call :func:`train_step`, so the benchmark times the step that training takes. Nothing in
it reads a device value on the host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from grab_exp.balance import Ordering
from grab_exp.losses import CrossEntropy, Loss
from grab_exp.optim import GSNROptimizer

#: the parts of a step, in order (``reduce`` only in data-parallel jobs)
STAGES = ("grads", "gsnr", "ordering", "reduce", "opt")
Stage = Callable[[str, Callable[[], Any]], Any]


def untimed(name: str, fn: Callable[[], Any]) -> Any:
    """The default ``stage``: run the part, time nothing."""
    return fn()


@dataclass
class StepParts:
    """What one step uses.

    Attributes:
        pipeline: ``(x, y) -> (loss (), grads)``; sets ``param.grad`` to the batch mean.
        ordering: takes the per-sample gradients (``None`` when it needs none) and the indices.
        reduce_gradients: averages ``param.grad`` over data-parallel workers; ``None`` alone.
        loss: the job's loss (:mod:`grab_exp.losses`; the evaluation sums it over a split).
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer
    pipeline: Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, Any]]
    ordering: Ordering
    reduce_gradients: Callable[[], None] | None = None
    loss: Loss = field(default_factory=CrossEntropy)

    def __post_init__(self) -> None:
        self.uses_gsnr = isinstance(self.optimizer, GSNROptimizer)
        self.needs_grads = bool(self.ordering.needs_grads)


def train_step(
    parts: StepParts,
    x: torch.Tensor,
    y: torch.Tensor,
    indices: torch.Tensor,
    stage: Stage = untimed,
) -> torch.Tensor:
    """One optimizer step on the batch ``x (B, ...)``, ``y (B,)`` of examples ``indices (B,)``.

    ``stage(name, fn)`` runs each part (:data:`STAGES`); the benchmark passes one that times.

    Returns:
        The batch's mean loss ``()``, detached, on the device.
    """
    parts.optimizer.zero_grad(set_to_none=True)
    loss, grads = stage("grads", lambda: parts.pipeline(x, y))
    if parts.uses_gsnr:  # this batch's GSNR, before the ordering sees the gradients
        stage("gsnr", lambda: parts.optimizer.observe(grads))
    stage("ordering", lambda: parts.ordering.step(grads if parts.needs_grads else None, indices))
    if parts.reduce_gradients is not None:
        stage("reduce", parts.reduce_gradients)
    stage("opt", parts.optimizer.step)
    return loss
