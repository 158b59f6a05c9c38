"""Whole-dataset evaluation at the end of an epoch."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

#: a loss summed over a batch's examples: ``(out, y) -> ()``
Total = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def cross_entropy_total(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The cross-entropy summed over the batch: :func:`evaluate`'s default."""
    return F.cross_entropy(out, y, reduction="sum")


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    batch_size: int,
    total: Total = cross_entropy_total,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean loss per example and accuracy of ``model`` (in eval mode) on a whole split.

    Image batches go through the model in the channels-last layout, where CPU convolutions
    run about twice as fast as in the default one (LeNet on CIFAR-10's 60,000 images); the
    layout changes how the convolutions compute, not what the function returns.

    Args:
        x: ``(N, ...)`` inputs on the model's device; y: ``(N,)`` labels (or ``(N, T)``: a
            label per position, as a language model's next tokens; accuracy over all of them).
        batch_size: examples per forward pass.
        total: the loss summed over a batch's examples (the job's loss, ``Loss.total``).

    Returns:
        ``(loss, acc)`` as 0-dim tensors on the device (no host sync here).
    """
    was_training = model.training
    model.eval()
    loss_sum = torch.zeros((), dtype=torch.float64, device=x.device)
    correct = torch.zeros((), dtype=torch.long, device=x.device)
    for start in range(0, len(x), batch_size):
        logits = model(_fast_layout(x[start : start + batch_size]))  # (b, [T,] classes)
        labels = y[start : start + batch_size]  # (b, [T])
        loss_sum += total(logits, labels)
        correct += (logits.argmax(dim=-1) == labels).sum()
    model.train(was_training)
    return loss_sum / len(x), correct.double() / y.numel()


def _fast_layout(batch: torch.Tensor) -> torch.Tensor:
    """A ``(b, C, H, W)`` batch in the channels-last layout; other shapes as they are."""
    return batch.contiguous(memory_format=torch.channels_last) if batch.dim() == 4 else batch
