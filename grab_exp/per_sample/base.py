"""The one interface of the per-sample paths: :class:`PerSampleGradients`.

Like opacus's ``AbstractGradSampleModule``: one abstract base, one subclass per method
(``func``, ``hooks``, ``factored``), built by name with
:func:`~grab_exp.per_sample.pipeline.make_per_sample`. Every path keeps one contract:

* ``loss, grads = psg(x, y)`` returns the detached mean loss ``()`` and a
  :class:`~grab_exp.grads.batch.BatchGrads`, the per-sample gradients of the trainable
  parameters (``named_parameters`` order);
* the same call adds the batch's mean gradient to every trainable ``param.grad``, as
  ``loss.backward()`` would (after ``optimizer.zero_grad()`` it is that gradient).

BatchNorm in training mode and active Dropout without a ``randomness`` break per-sample
gradients (batch statistics mix the examples; a mask must be drawn per example): the model is
checked at construction and, by a flag read on the few such modules, at every call.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from grab_exp.grads import BatchGrads

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

_BATCHNORM = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)
# Base of Dropout, Dropout1d/2d/3d, AlphaDropout and FeatureAlphaDropout.
_DROPOUT = (nn.modules.dropout._DropoutNd,)


class PerSampleGradients(ABC):
    """Per-sample gradients of one model's loss; subclasses implement :meth:`_compute`.

    Args:
        model: The module to differentiate.
        loss_fn: ``loss_fn(logits, y)`` returning the batch MEAN of per-example losses (e.g.
            ``torch.nn.functional.cross_entropy``).

    Attributes:
        method: the name :func:`~grab_exp.per_sample.pipeline.make_per_sample` knows it by.
        randomness: vmap's ``randomness`` for random layers; ``None``: active dropout is refused.

    Raises:
        ValueError: a BatchNorm module in training mode (or without running statistics), or a
            Dropout with ``p > 0`` in training mode without ``randomness``; the message names the
            module's qualified name.
    """

    method: ClassVar[str]
    randomness: str | None = None

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        self.model, self.loss_fn = model, loss_fn
        self._watched = [
            (name, m) for name, m in model.named_modules() if isinstance(m, _BATCHNORM + _DROPOUT)
        ]
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` naming the first module whose mode breaks per-sample gradients."""
        for name, module in self._watched:
            problem = _module_problem(name, module, self.randomness)
            if problem is not None:
                raise ValueError(problem)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """Add the batch's mean gradient to ``param.grad``; return the per-sample ones.

        Args:
            x: Inputs ``(B, ...)``.
            y: Targets ``(B, ...)``.

        Returns:
            ``(loss, grads)``: the detached mean loss ``()`` and the ``(B, d)`` per-sample
            gradients.
        """
        self.check()
        return self._compute(x, y)

    @abstractmethod
    def _compute(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """:meth:`__call__` after the check."""


def _module_problem(name: str, module: nn.Module, randomness: str | None) -> str | None:
    """Why ``module`` in its current mode breaks per-sample gradients; ``None`` if it doesn't."""
    label = f"{name or '<root>'} ({type(module).__name__})"
    if isinstance(module, _BATCHNORM) and (module.training or module.running_mean is None):
        mode = "in training mode" if module.training else "without running statistics"
        return (
            f"{label} {mode}: per-sample gradients are undefined because batch statistics mix "
            "the examples of a batch; use eval mode with running statistics, or GroupNorm/LayerNorm"
        )
    if isinstance(module, _DROPOUT) and module.training and randomness is None and module.p > 0:
        return (
            f"{label} with p={module.p} in training mode needs an explicit randomness setting: "
            "method=func with randomness='different' (independent masks per example) or "
            "'same', or put it in eval mode"
        )
    return None
