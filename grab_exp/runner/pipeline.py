"""Gradient pipelines: how one training step turns a batch into gradients."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from grab_exp.per_sample import PerSampleGradients

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ClassicPipeline:
    """Plain ``loss.backward()`` on the batch mean (no per-sample gradients)."""

    provides_per_sample: ClassVar[bool] = False

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        self.model, self.loss_fn = model, loss_fn

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Set ``param.grad`` to the batch's mean gradient.

        Args:
            x: ``(B, 3, 32, 32)`` inputs; y: ``(B,)`` labels.

        Returns:
            ``(loss, None)`` with the detached mean loss ``()``.
        """
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss.detach(), None


class FunctionalPipeline:
    """Per-sample gradients (torch.func); their mean is written into ``param.grad``."""

    provides_per_sample: ClassVar[bool] = True

    def __init__(self, model: nn.Module, loss_fn: LossFn, chunk_size: int | None = None) -> None:
        self.per_sample = PerSampleGradients(model, loss_fn, chunk_size=chunk_size)

    def __call__(
        self, x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Set ``param.grad`` to the mean gradient and return the per-sample ones.

        Returns:
            ``(loss, grads)``: detached mean loss ``()`` and name -> ``(B, *shape)``.
        """
        loss, grads = self.per_sample(x, y)
        self.per_sample.accumulate_mean(grads)
        return loss, grads
