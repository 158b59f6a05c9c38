"""``method=func``: whole-model per-sample gradients with ``torch.func`` (``vmap(grad)``).

``functional_call`` evaluates one example at a time under ``vmap``, so any model works (tied
weights, parameters used outside their module), at the cost of a forward and backward that are
batched by ``vmap`` rather than written for the batch. Nothing here calls ``.item()``/
``.tolist()`` or loops over examples in Python, so a step stays free of host synchronization on
CUDA.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from grab_exp.grads import BatchGrads, as_batch_grads
from grab_exp.per_sample.base import LossFn, PerSampleGradients
from grab_exp.per_sample.compiled import compile_step
from grab_exp.per_sample.modules import UnsupportedModelError
from grab_exp.validation import check_int_at_least

__all__ = ["RANDOMNESS_CHOICES", "FuncPerSample"]

Grads = dict[str, torch.Tensor]

#: Layers whose kernels torch's vmap fails on (the default zero hidden state it writes into).
VMAP_FAILS = (nn.RNN, nn.GRU, nn.RNNCell, nn.GRUCell)

#: Explicit values of vmap's ``randomness`` that allow random layers (dropout).
RANDOMNESS_CHOICES = ("different", "same")


def split_state(module: nn.Module, names: Iterable[str] | None = None) -> tuple[Grads, Grads]:
    """Split the module's tensors, detached, into the differentiated ones and everything else.

    Returns:
        ``(trainable, fixed)``: the trainable parameters among ``names`` (qualified, in that
        order; by default all, in ``named_parameters`` order), and the other parameters plus
        the buffers (passed to ``functional_call``, never differentiated).
    """
    params = dict(module.named_parameters())
    chosen = params if names is None else names
    trainable = {n: params[n].detach() for n in chosen if params[n].requires_grad}
    fixed = {n: p.detach() for n, p in params.items() if n not in trainable}
    fixed.update((n, b.detach()) for n, b in module.named_buffers())
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


def vmap_failure(model: nn.Module, error: RuntimeError) -> str:
    """One line for a first call that ``torch.func`` could not run, naming the recurrent layers
    (torch's vmap cannot batch ``nn.RNN``/``nn.GRU`` and their cells)."""
    cause = str(error).strip().splitlines()[0]
    unbatchable = [
        f"{name} ({type(m).__name__})"
        for name, m in model.named_modules()
        if isinstance(m, VMAP_FAILS)
    ]
    if not unbatchable:
        return f"torch.func's vmap failed on this model ({cause})"
    return (
        f"torch.func's vmap failed at {', '.join(unbatchable)}, which it cannot batch ({cause}); "
        "method=auto or hooks replays such layers one example at a time"
    )


class FuncPerSample(PerSampleGradients):
    """Per-sample gradients of the whole model with ``vmap(grad(loss of one example))``.

    Args:
        model: The module to differentiate; its buffers (e.g. BatchNorm running statistics in
            eval mode) and frozen parameters are passed in but not differentiated.
        loss_fn: Per-example loss, called as ``loss_fn(model(x_i[None]), y_i[None])`` (batch dim
            of 1, e.g. ``F.cross_entropy``); its output is summed, so any reduction works.
        chunk_size: Examples per ``vmap`` chunk (bounds memory), or ``None`` for the whole batch.
        randomness: ``None`` (dropout with ``p > 0`` in training mode is an error),
            ``"different"`` or ``"same"`` (vmap's randomness; allows dropout).
        compile_mode: ``None`` (eager) or a ``torch.compile`` mode: ``vmap(grad)`` runs as one
            compiled graph (:func:`~grab_exp.per_sample.compiled.compile_step`; equal up to
            float32 rounding: inductor may reorder reductions).

    Raises:
        ValueError: an invalid ``randomness``/``chunk_size``, or the model check of
            :class:`~grab_exp.per_sample.base.PerSampleGradients`.
    """

    method = "func"

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        chunk_size: int | None = None,
        *,
        randomness: str | None = None,
        compile_mode: str | None = None,
    ) -> None:
        if chunk_size is not None:  # None: the whole batch at once
            check_int_at_least("pipeline.chunk_size", chunk_size, 1)
        if randomness is not None and randomness not in RANDOMNESS_CHOICES:
            raise ValueError(
                f"randomness={randomness!r} is not valid; allowed values: None (no random "
                "layers), " + ", ".join(repr(c) for c in RANDOMNESS_CHOICES)
            )
        self.chunk_size, self.randomness, self.compile_mode = chunk_size, randomness, compile_mode
        super().__init__(model, loss_fn)
        self._grad_fn = _make_grad_fn(model, loss_fn, chunk_size, randomness)
        if compile_mode is not None:
            self._grad_fn = compile_step(self._grad_fn, compile_mode)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        if not self.unverified:
            return super().__call__(x, y)
        try:
            return super().__call__(x, y)  # the first call: a vmap failure shows here
        except RuntimeError as error:
            raise UnsupportedModelError(vmap_failure(self.model, error)) from error

    def _compute(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        trainable, fixed = split_state(self.model)
        grads, losses = self._grad_fn(trainable, fixed, x, y)  # {name: (B, *shape)}, (B,)
        for name, p in self.model.named_parameters():
            g = grads.get(name)
            if g is not None:
                mean = g.mean(dim=0).to(p.dtype)  # (*param.shape)
                p.grad = mean if p.grad is None else p.grad.add_(mean)
        return losses.mean(), as_batch_grads(grads)
