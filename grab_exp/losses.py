"""The training losses of the ``loss`` config group, each the batch MEAN of per-example losses.

Every loss here keeps the per-sample contract of ``docs/which-models-work.md``: its value on a
batch is the mean over the batch's examples of each example's own loss, so per-sample
gradients are well defined. :meth:`Loss.total` is the sum of the examples' losses, which the
evaluation adds up over a whole split.
"""

from __future__ import annotations

from typing import ClassVar

import torch
from torch.nn import functional as F


class Loss:
    """A loss ``(out, y) -> ()``: the batch mean of per-example losses.

    Attributes:
        perplexity: whether ``exp`` of the loss is a metric of the task (a language model's
            per-token cross-entropy): the runner then logs ``train/ppl`` and ``test/ppl``.
    """

    perplexity: ClassVar[bool] = False

    def __call__(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.total(out, y) / len(y)

    def total(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The sum over the batch of each example's loss ``()``."""
        raise NotImplementedError


class CrossEntropy(Loss):
    """Cross-entropy of logits ``(B, C)`` against labels ``(B,)``, optionally label-smoothed.

    Args:
        label_smoothing: in ``[0, 1)``: the target puts ``1 - s`` on the label and spreads
            ``s`` over all classes (PyTorch's definition).
    """

    def __init__(self, label_smoothing: float = 0.0) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"loss.label_smoothing: got {label_smoothing}; allowed: 0 <= s < 1")
        self.label_smoothing = float(label_smoothing)

    def __call__(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y, label_smoothing=self.label_smoothing)

    def total(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out, y, reduction="sum", label_smoothing=self.label_smoothing)


class TokenCrossEntropy(Loss):
    """A language model's loss: logits ``(B, T, V)`` against next tokens ``(B, T)``, the mean
    over every token; with ``T`` the same for every example it is the mean over the examples of
    each one's per-token mean (the per-sample contract). ``exp`` of it is the perplexity."""

    perplexity: ClassVar[bool] = True

    def __call__(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(out.flatten(0, -2), y.flatten())

    def total(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        tokens = y[0].numel()  # T per example
        return F.cross_entropy(out.flatten(0, -2), y.flatten(), reduction="sum") / tokens


class OneHotMSE(Loss):
    """Squared error between the outputs ``(B, C)`` and the one-hot labels ``(B,)``, the mean
    over the ``C`` outputs of each example, then over the batch."""

    def __call__(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(out, F.one_hot(y, out.shape[-1]).to(out.dtype))

    def total(self, out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        target = F.one_hot(y, out.shape[-1]).to(out.dtype)
        return F.mse_loss(out, target, reduction="sum") / out.shape[-1]
