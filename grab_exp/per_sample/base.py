"""The one interface of the per-sample paths: :class:`PerSampleGradients`.

Like opacus's ``AbstractGradSampleModule``: one abstract base, one subclass per method
(``func``, ``hooks``, ``factored``), built by name with
:func:`~grab_exp.per_sample.pipeline.make_per_sample`. Every path keeps one contract:

* ``loss, grads = psg(x, y)`` returns the detached mean loss ``()`` and a
  :class:`~grab_exp.grads.batch.BatchGrads`, the per-sample gradients of the trainable
  parameters (``named_parameters`` order);
* the same call adds the batch's mean gradient to every trainable ``param.grad``, as
  ``loss.backward()`` would (after ``optimizer.zero_grad()`` it is that gradient).

BatchNorm in training mode breaks per-sample gradients (batch statistics mix the examples):
the model is checked at construction and, by a flag read on the few such modules, at every call.
Active Dropout is refused by ``func`` without a ``randomness`` (vmap must be told how to draw
masks); the hook path takes the masks its one batch forward drew
(:attr:`PerSampleGradients.module_dropout`).

The loss contract: ``loss_fn(logits, y)`` is the batch MEAN of per-example losses. The first call
of every path checks it, and checks the path's per-sample gradients against a per-example
computation (:mod:`grab_exp.per_sample.verify`).
"""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.modules import BATCHNORM, DROPOUT, module_problem
from grab_exp.per_sample.verify import verify

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


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
    #: whether the first call still has to be checked (:mod:`grab_exp.per_sample.verify`); set
    #: it to ``False`` to skip the check
    unverified: bool = True
    #: whether Dropout modules in training mode are right without a ``randomness``: the hook path
    #: reads each layer's input after the batch forward's masks, so its gradients are the
    #: per-example gradients under those masks
    module_dropout: ClassVar[bool] = False

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        self.model, self.loss_fn = model, loss_fn
        self._watched = [
            (name, m) for name, m in model.named_modules() if isinstance(m, BATCHNORM + DROPOUT)
        ]
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` naming the first module whose mode breaks per-sample gradients."""
        for name, module in self._watched:
            problem = module_problem(name, module, self.randomness, self.module_dropout)
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
        if self.unverified:
            verify(self, x, y)
            self.unverified = False
        return self._compute(x, y)

    def state_bytes(self) -> int:
        """Bytes the path keeps between calls (the hook path's reused ``(B, d)`` buffer)."""
        return 0

    def quiet(self) -> contextlib.AbstractContextManager:
        """A context in which the model runs as a plain model (a path's hooks stay idle)."""
        return contextlib.nullcontext()

    @abstractmethod
    def _compute(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """:meth:`__call__` after the check."""
