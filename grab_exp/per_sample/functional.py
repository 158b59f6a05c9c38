"""Whole-model per-sample gradients with ``torch.func`` (``functional_call``, ``vmap``, ``grad``).

GraB orders examples by their individual gradients, so a training step needs the ``(B, d)``
matrix of per-sample gradients as well as their mean (which drives the optimizer). In a user's own
loop the integration is three lines::

    psg = PerSampleGradients(model, F.cross_entropy)
    loss, grads = psg(x, y); psg.accumulate_mean(grads)  # sets p.grad
    sampler.step(grads)

Nothing here calls ``.item()``/``.tolist()`` or loops over examples in Python, so a step stays free
of host synchronization on CUDA.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from grab_exp.balance.tensors import flatten_grads

__all__ = [
    "RANDOMNESS_CHOICES",
    "PerSampleGradients",
    "accumulate_mean",
    "per_sample_grads",
    "per_sample_width",
]

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
Grads = dict[str, torch.Tensor]

#: Explicit values of vmap's ``randomness`` that allow random layers (dropout).
RANDOMNESS_CHOICES = ("different", "same")

_BATCHNORM = (nn.modules.batchnorm._BatchNorm, nn.SyncBatchNorm)
# Base of Dropout, Dropout1d/2d/3d, AlphaDropout and FeatureAlphaDropout.
_DROPOUT = (nn.modules.dropout._DropoutNd,)


def _check_randomness(randomness: str | None) -> None:
    if randomness is not None and randomness not in RANDOMNESS_CHOICES:
        raise ValueError(
            f"randomness={randomness!r} is not valid; allowed values: None (no random layers), "
            + ", ".join(repr(c) for c in RANDOMNESS_CHOICES)
        )


def _check_chunk_size(chunk_size: int | None) -> None:
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise ValueError(f"chunk_size={chunk_size!r} is not valid; use None or an integer >= 1")


def _split_state(model: nn.Module) -> tuple[Grads, Grads]:
    """Split the model's tensors into trainable parameters and everything else.

    Returns:
        ``(trainable, fixed)``: detached trainable parameters in ``named_parameters`` order, and
        the frozen parameters plus buffers (passed to ``functional_call``, never differentiated).
    """
    trainable, fixed = {}, {}
    for name, p in model.named_parameters():
        (trainable if p.requires_grad else fixed)[name] = p.detach()
    fixed.update((name, b.detach()) for name, b in model.named_buffers())
    return trainable, fixed


def _make_grad_fn(
    model: nn.Module, loss_fn: LossFn, chunk_size: int | None, randomness: str | None
) -> Callable[[Grads, Grads, torch.Tensor, torch.Tensor], tuple[Grads, torch.Tensor]]:
    """Build ``vmap(grad(loss of one example))`` over the batch dimension of ``x`` and ``y``."""

    def one_example(trainable: Grads, fixed: Grads, xi: torch.Tensor, yi: torch.Tensor):
        out = functional_call(model, (trainable, fixed), (xi.unsqueeze(0),))  # (1, ...)
        loss = loss_fn(out, yi.unsqueeze(0)).sum()  # () whatever the loss's reduction
        return loss, loss.detach()

    return vmap(
        grad(one_example, has_aux=True),
        in_dims=(None, None, 0, 0),
        chunk_size=chunk_size,
        randomness=randomness or "error",
    )


def per_sample_grads(
    model: nn.Module,
    loss_fn: LossFn,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    chunk_size: int | None = None,
    randomness: str | None = None,
) -> tuple[torch.Tensor, Grads]:
    """Per-sample gradients of ``loss_fn(model(x_i), y_i)`` for every example ``i`` of a batch.

    The model is not validated here; use :class:`PerSampleGradients` for clear errors about
    BatchNorm in training mode and dropout.

    Args:
        model: Module evaluated functionally; its buffers (e.g. BatchNorm running statistics in
            eval mode) and frozen parameters are passed in but not differentiated.
        loss_fn: Per-example loss, called as ``loss_fn(model(x_i[None]), y_i[None])`` (batch dim of
            1, e.g. ``F.cross_entropy``); its output is summed, so any reduction works.
        x: Inputs, ``# (B, ...)``.
        y: Targets, ``# (B, ...)``.
        chunk_size: Examples per ``vmap`` chunk (bounds memory); ``None`` vectorizes the whole
            batch.
        randomness: vmap's ``randomness`` (``"different"`` or ``"same"``) for models with random
            layers; ``None`` means random operations raise.

    Returns:
        ``(loss, grads)``: the mean loss over the batch, a **detached** scalar tensor ``# ()``
        (for logging; the gradients come from ``grads``), and a dict from parameter name to
        per-sample gradients ``# (B, *param.shape)`` for the trainable parameters, in
        ``named_parameters`` order.
    """
    _check_chunk_size(chunk_size)
    _check_randomness(randomness)
    trainable, fixed = _split_state(model)
    grads, losses = _make_grad_fn(model, loss_fn, chunk_size, randomness)(trainable, fixed, x, y)
    return losses.mean(), grads  # (), {name: (B, *shape)}


def per_sample_width(grads: Grads) -> int:
    """``d``: the number of gradient values per example in ``grads`` (name -> ``# (B, *shape)``)."""
    return sum(g.shape[1:].numel() for g in grads.values())


def accumulate_mean(model: nn.Module, grads: Grads) -> None:
    """Add the batch mean of the per-sample gradients to ``param.grad``, like ``loss.backward()``.

    After ``optimizer.zero_grad()`` (which sets grads to ``None``) this sets ``param.grad`` to the
    mean gradient, so any ordinary ``torch.optim`` optimizer can step on it.

    Args:
        model: The module the gradients were computed for.
        grads: Dict name -> ``# (B, *param.shape)``; parameters absent from it are left untouched.
    """
    for name, p in model.named_parameters():
        g = grads.get(name)
        if g is None:
            continue
        mean = g.mean(dim=0).to(p.dtype)  # (*param.shape)
        if p.grad is None:
            p.grad = mean
        else:
            p.grad.add_(mean)


def _norm_and_dropout_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    return [(n, m) for n, m in model.named_modules() if isinstance(m, _BATCHNORM + _DROPOUT)]


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
            "PerSampleGradients(..., randomness='different') (independent masks per example) or "
            "'same', or put it in eval mode"
        )
    return None


class PerSampleGradients:
    """Per-sample gradient computer for one model, validated once at construction.

    The walk over the model's modules happens once; the few BatchNorm/Dropout modules it finds
    are re-checked (a flag read, no tensor work) on every call, so switching the model to
    training mode later still gives a clear error instead of an obscure ``vmap`` one.

    Args:
        model: The module to differentiate.
        loss_fn: Per-example loss, e.g. ``torch.nn.functional.cross_entropy``.
        chunk_size: Examples per ``vmap`` chunk, or ``None`` for the whole batch at once.
        randomness: ``None`` (dropout with ``p > 0`` in training mode is an error),
            ``"different"`` or ``"same"`` (vmap's randomness; allows dropout).

    Raises:
        ValueError: A BatchNorm module is in training mode, a dropout module is active without
            ``randomness``, or ``randomness``/``chunk_size`` is invalid. The message names the
            module's qualified name.
    """

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        chunk_size: int | None = None,
        *,
        randomness: str | None = None,
    ) -> None:
        _check_chunk_size(chunk_size)
        _check_randomness(randomness)
        self.model = model
        self.loss_fn = loss_fn
        self.chunk_size = chunk_size
        self.randomness = randomness
        self._watched = _norm_and_dropout_modules(model)
        self._grad_fn = _make_grad_fn(model, loss_fn, chunk_size, randomness)
        self.check()

    def check(self) -> None:
        """Raise ``ValueError`` naming the first module whose mode breaks per-sample gradients."""
        for name, module in self._watched:
            problem = _module_problem(name, module, self.randomness)
            if problem is not None:
                raise ValueError(problem)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Grads]:
        """Mean loss and per-sample gradients of a batch; see :func:`per_sample_grads`.

        Args:
            x: Inputs, ``# (B, ...)``.
            y: Targets, ``# (B, ...)``.

        Returns:
            ``(loss, grads)``: detached mean loss ``# ()`` and dict name -> ``# (B, *param.shape)``.
        """
        self.check()
        trainable, fixed = _split_state(self.model)
        grads, losses = self._grad_fn(trainable, fixed, x, y)
        return losses.mean(), grads

    @staticmethod
    def flat(grads: Grads) -> torch.Tensor:
        """Per-sample gradients as one ``# (B, d)`` matrix (``balance.tensors.flatten_grads``)."""
        return flatten_grads(grads, per_sample_width(grads))

    def accumulate_mean(self, grads: Grads) -> None:
        """Add the mean gradient to ``param.grad``; see :func:`accumulate_mean`."""
        accumulate_mean(self.model, grads)
