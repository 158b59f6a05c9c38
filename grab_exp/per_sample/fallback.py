"""Per-layer ``torch.func`` fallback: per-sample grads of one layer that has no rule.

Like opacus's functorch fallback: the layer alone is re-evaluated functionally on its saved
input, one example at a time under ``vmap``, and ``grad`` of ``<g_b, layer(a_b)>`` with respect to
the layer's OWN trainable parameters (``recurse=False``) is example ``b``'s gradient (``g_b``:
the saved gradient at the layer's output). Submodules keep their own rules or fallbacks; their
parameters, the layer's frozen ones and its buffers are passed in but not differentiated.

The layer's positional tensor arguments are batched along dim 0; other positional arguments and
non-tensor keyword arguments are passed to every example unchanged. The layer must return one
tensor. Random operations inside it raise (``vmap(randomness="error")``): the re-evaluation
could not reproduce the forward's draws.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap

from grab_exp.per_sample.rules.base import Outs

__all__ = ["FuncFallback", "fallback_problem"]


def fallback_problem(args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> str | None:
    """Why one call of a layer cannot be replayed by :class:`FuncFallback`; ``None`` if it can."""
    if not isinstance(output, torch.Tensor):
        return f"returned {type(output).__name__}, not one tensor"
    if any(isinstance(v, torch.Tensor) for v in kwargs.values()):
        return "was called with tensor keyword arguments"
    if not any(isinstance(a, torch.Tensor) for a in args):
        return "was called without a positional tensor input"
    return None


class FuncFallback:
    """Per-sample and mean gradients of one layer's own parameters with ``torch.func``.

    Args:
        layer: A module with trainable parameters of its own and no rule.
    """

    def __init__(self, layer: nn.Module) -> None:
        self.layer = layer
        self.names = [n for n, _ in layer.named_parameters(recurse=False)]

    def _state(self) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        """``(own trainable, everything else)``, detached, for ``functional_call``."""
        own = {
            n: p.detach() for n, p in self.layer.named_parameters(recurse=False) if p.requires_grad
        }
        fixed = {n: p.detach() for n, p in self.layer.named_parameters() if n not in own}
        fixed.update((n, b.detach()) for n, b in self.layer.named_buffers())
        return own, fixed

    def per_sample(
        self, args: tuple[Any, ...], kwargs: dict[str, Any], g: torch.Tensor, out: Outs
    ) -> list[torch.Tensor | None]:
        """Per-sample gradients, one per own parameter (``None`` for frozen ones).

        Args:
            args: The layer's positional inputs; tensors ``# (B, ...)``.
            kwargs: Its keyword inputs (no tensors).
            g: The gradient of the SUM of per-example losses at its output ``# (B, ...)``.
            out: Per own parameter, an optional ``# (B, *p.shape)`` tensor to write into.
        """
        own, fixed = self._state()
        layer = self.layer

        def one_example(own_i: dict[str, torch.Tensor], args_i: tuple, g_i: torch.Tensor):
            batched = tuple(a.unsqueeze(0) if isinstance(a, torch.Tensor) else a for a in args_i)
            output = functional_call(layer, (own_i, fixed), batched, kwargs)  # (1, ...)
            return (output * g_i.unsqueeze(0)).sum()  # (): <g_b, layer(a_b)>

        dims = tuple(0 if isinstance(a, torch.Tensor) else None for a in args)
        grads = vmap(grad(one_example), in_dims=(None, dims, 0))(own, args, g)  # n -> (B, *shape)
        return [_write(grads.get(n), o) for n, o in zip(self.names, out, strict=True)]

    @staticmethod
    def mean(g: torch.Tensor, per_sample: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
        """Batch-mean gradients ``[p.shape]`` from the per-sample ones (``g``: ``# (B, ...)``)."""
        batch = g.shape[0]
        return [None if p is None else p.sum(dim=0).div_(batch) for p in per_sample]


def _write(grad_: torch.Tensor | None, out: torch.Tensor | None) -> torch.Tensor | None:
    return grad_ if grad_ is None or out is None else out.copy_(grad_)
