"""Gradient pipelines: how one training step turns a batch into gradients."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import torch
from torch import nn

from grab_exp.per_sample.compiled import (
    CompiledPerSampleGradients,
    check_compile_method,
    compiled_loss,
)
from grab_exp.per_sample.functional import PerSampleGradients
from grab_exp.per_sample.hooks import (
    HookedPerSampleGradients,
    UnsupportedModelError,
    check_supported,
)
from grab_exp.per_sample.rules import rule_for
from grab_exp.validation import check_choice

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ClassicPipeline:
    """Plain ``loss.backward()`` on the batch mean (no per-sample gradients).

    Args:
        compile_mode: ``None`` (eager) or a ``torch.compile`` mode: forward and loss run as one
            compiled graph, and so does their backward (see :mod:`grab_exp.per_sample.compiled`).
    """

    provides_per_sample: ClassVar[bool] = False

    def __init__(self, model: nn.Module, loss_fn: LossFn, compile_mode: str | None = None) -> None:
        self.model, self.loss_fn = model, loss_fn
        self.compile_mode = compile_mode
        self._forward_loss = (
            compiled_loss(model, loss_fn, compile_mode) if compile_mode is not None else None
        )

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Set ``param.grad`` to the batch's mean gradient.

        Args:
            x: ``(B, 3, 32, 32)`` inputs; y: ``(B,)`` labels.

        Returns:
            ``(loss, None)`` with the detached mean loss ``()``.
        """
        if self._forward_loss is not None:
            loss = self._forward_loss(x, y)
        else:
            loss = self.loss_fn(self.model(x), y)
        loss.backward()
        return loss.detach(), None


class FunctionalPipeline:
    """Per-sample gradients; their mean is written into ``param.grad``.

    Args:
        method: ``func`` (torch.func vmap(grad) of the whole model, any model), ``hooks`` (one
            ordinary backward; per-layer rules, a per-layer torch.func fallback for other
            layers), ``factored`` (``hooks``, but Linear layers return their factors, see
            :mod:`grab_exp.balance.factored`) or ``auto`` (``factored`` when ``factors`` and
            :func:`auto_hooks_method` say so, else ``hooks`` when :func:`hooks_supported`, else
            ``func``).
        chunk_size: examples per vmap chunk for ``func`` (bounds memory).
        compile_mode: ``None`` (eager) or a ``torch.compile`` mode: the ``func`` path's
            ``vmap(grad)`` is compiled; ``auto`` then means ``func``, and ``hooks`` is refused
            (see :mod:`grab_exp.per_sample.compiled`).
        reuse_buffer: ``hooks`` writes every step's per-sample gradients into one reused
            ``(B, d)`` buffer, which the ordering takes without a copy; the returned tensors are
            overwritten by the next call (see
            :class:`~grab_exp.per_sample.hooks.HookedPerSampleGradients`).
        factors: whether the consumer reads factors (an ordering's ``takes_factors``); if not,
            ``auto`` picks ``hooks`` over ``factored`` (recursive balance materializes them).
    """

    provides_per_sample: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        chunk_size: int | None = None,
        method: str = "auto",
        compile_mode: str | None = None,
        reuse_buffer: bool = True,
        factors: bool = True,
    ) -> None:
        check_choice("pipeline.method", method, METHODS)
        self.compile_mode = compile_mode
        if compile_mode is not None:
            check_compile_method(method)
            method = "func"
        elif method == "auto":
            method = "func" if not hooks_supported(model) else auto_hooks_method(model)
            method = "hooks" if method == "factored" and not factors else method
        self.method = method
        if method in ("hooks", "factored"):
            self.per_sample = HookedPerSampleGradients(
                model, loss_fn, reuse_buffer=reuse_buffer, factored=method == "factored"
            )
        elif compile_mode is not None:
            self.per_sample = CompiledPerSampleGradients(
                model, loss_fn, chunk_size, mode=compile_mode
            )
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


METHODS = ("func", "hooks", "factored", "auto")

#: ``auto`` factors when the layers without a factor form hold at most this share of the weights
MATERIALIZED_SHARE = 0.125


def auto_hooks_method(model: nn.Module) -> str:
    """``factored`` when layers without a factor rule hold few weights, else ``hooks``.

    Only the layers' types are read: a Linear whose sequence turns out long materializes itself
    at the first call (:func:`~grab_exp.balance.factored.factor_pays`).
    """
    total = materialized = 0
    for module in model.modules():
        count = sum(p.numel() for p in module.parameters(recurse=False) if p.requires_grad)
        rule = rule_for(module)
        total += count
        materialized += 0 if rule is not None and rule.has_factors else count
    return "factored" if materialized <= MATERIALIZED_SHARE * total else "hooks"


def hooks_supported(model: nn.Module) -> bool:
    """Whether ``method=auto`` picks the hook path for ``model``.

    True when every trainable layer gets a rule or the per-layer ``torch.func`` fallback
    (:func:`~grab_exp.per_sample.hooks.check_supported` passes: no tied weights, no parameters
    used outside their module's forward), unless the root module owns trainable parameters
    itself: its fallback would re-run the whole model under ``vmap``, which ``func`` does in one
    pass. A fallback layer that turns out not to return one tensor is only found at the first
    call (``UnsupportedModelError`` naming it).
    """
    if any(p.requires_grad for p in model.parameters(recurse=False)):
        return False
    try:
        check_supported(model)
    except UnsupportedModelError:
        return False
    return True
