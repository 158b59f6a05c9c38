"""Gradient pipelines: how one training step turns a batch into gradients."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from grab_exp.per_sample import PerSampleGradients
from grab_exp.per_sample_hooks import (
    HookedPerSampleGradients,
    UnsupportedModelError,
    check_supported,
)
from grab_exp.validation import check_choice

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
    """Per-sample gradients; their mean is written into ``param.grad``.

    Args:
        method: ``func`` (torch.func vmap(grad), any model), ``hooks`` (one ordinary backward
            with Linear/Conv2d hooks) or ``auto`` (hooks when the model allows, else func).
        chunk_size: examples per vmap chunk for ``func`` (bounds memory).
    """

    provides_per_sample: ClassVar[bool] = True

    def __init__(
        self, model: nn.Module, loss_fn: LossFn, chunk_size: int | None = None, method: str = "auto"
    ) -> None:
        check_choice("pipeline.method", method, METHODS)
        if method == "auto":
            method = "hooks" if hooks_supported(model) else "func"
        self.method = method
        if method == "hooks":
            self.per_sample = HookedPerSampleGradients(model, loss_fn)
        else:
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


METHODS = ("func", "hooks", "auto")


def hooks_supported(model: nn.Module) -> bool:
    """Whether every trainable layer of ``model`` has a hook-based per-sample gradient."""
    try:
        check_supported(model)
    except UnsupportedModelError:
        return False
    return True
