"""The hook path's rows (:class:`Rows`) and the reused ``(B, d)`` buffer (:class:`GradBuffer`)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import nn

from grab_exp.grads import BatchGrads, as_batch_grads
from grab_exp.grads.batch import part_rows
from grab_exp.per_sample.base import one_line
from grab_exp.per_sample.layout import Call, CallLayout
from grab_exp.per_sample.modules import RelayedError, UnsupportedModelError
from grab_exp.per_sample.plan import Planner

Grads = dict[str, torch.Tensor]


class Rows:
    """The rows of a call's recorded layers (a rule, else the fallback), summed over each layer's
    calls; a rule's factors kept where they pay if ``factored``; into ``grad_buffer`` if given."""

    def __init__(self, planner: Planner, factored: bool, grad_buffer: GradBuffer | None) -> None:
        self.planner, self.layers = planner, planner.layers
        self.factored, self.grad_buffer = factored, grad_buffer

    def form(self, calls: dict[str, list[Call]], batch: int, params: dict[str, nn.Parameter]):
        """The rows of every trainable parameter (``(B, *shape)`` or factors), in
        ``named_parameters`` order (those of a parameter two layers share added up); ``sums``:
        name -> its rows' ``weighted_sum(coef, acc)`` where a rule has one (one layer's call)."""
        views = self._buffer_views(batch, params, calls)
        rows: dict[int, Any] = {}
        self._sums: dict[int, Any] = {}  # a rule layer's weight -> its rows' weighted sum
        for name, own in self.layers.own.items():
            out = [None if id(p) in rows else views.get(n) for n, p in own.items()]
            try:
                grads = self._layer_grads(name, calls.get(name, []), batch, out)
            except UnsupportedModelError:
                raise
            except Exception as error:  # a rule's or a replay's, named by its layer
                message = f"{self.layers.label(name)}: {one_line(error)}"
                raise RelayedError(message) from error
            for p, g in zip(own.values(), grads, strict=True):
                if id(p) in rows:  # shared: the sum of no one layer's rows
                    self._sums.pop(id(p), None)
                rows[id(p)] = g if id(p) not in rows else _added(rows[id(p)], g, p.shape)
        self.sums = {n: self._sums[id(p)] for n, p in params.items() if id(p) in self._sums}
        return {n: rows[id(p)] for n, p in params.items()}

    def batch_grads(self, rows: dict[str, Any], params: dict[str, nn.Parameter]) -> BatchGrads:
        if self.factored:
            return BatchGrads.from_parts(rows, {n: p.shape for n, p in params.items()})
        return as_batch_grads(rows)

    def _layer_grads(self, name: str, calls: list[Call], batch: int, out: list) -> list:
        """One layer's rows ``[(B, *p.shape)]`` (or factors); zeros if no call reached the loss."""
        total: list | None = None
        for call, layout in self.planner.call_layouts(name, calls):
            if all(g is None for g in call.grads):
                continue  # this call's outputs did not reach the loss
            grads = self._call_grads(name, call, layout, batch, out, len(calls) > 1)
            if total is not None:
                grads = [t if g is None else t.add_(g) for t, g in zip(total, grads, strict=True)]
            total, out = grads, [None] * len(out)
        if total is None:  # the layer did not reach the loss
            total = [
                p.new_zeros(batch, *p.shape) if o is None else o.zero_()
                for p, o in zip(self.layers.own[name].values(), out, strict=True)
            ]
        return total

    def _call_grads(
        self, name: str, call: Call, layout: CallLayout, batch: int, out: list, several: bool
    ) -> list:
        layer = self.layers.modules[name]
        sides = zip([*call.leaves, *call.grads], layout.inputs + layout.outputs, strict=True)
        for t, d in sides:  # the inputs, and the gradients at the outputs
            if d is not None and isinstance(t, torch.Tensor) and t.shape[d] != batch:
                raise UnsupportedModelError(
                    f"{self.layers.label(name)} ran on {t.shape[d]} items along the batch "
                    f"dimension its probe found, for {batch} examples (a selection of the examples"
                    ", as AdaptiveLogSoftmaxWithLoss's tails or h[mask]: data-dependent); use "
                    "method=func or loop (auto tries them)"
                )
        for k, g in enumerate(call.grads):
            if g is not None and layout.outputs[k] is None:
                raise UnsupportedModelError(
                    f"{self.layers.label(name)} returns a tensor of shape {tuple(g.shape)} without "
                    "a batch dimension (a value of the whole batch, as h.mean()) that reaches the "
                    "loss, whose share per example the hook path cannot tell; use method=func"
                )
        if (rule := self.layers.rules.get(name)) is not None:
            a, dtype = call.leaves[0].movedim(layout.inputs[0], 0), layer.weight.dtype  # (B, ...)
            g_sum = call.grads[0].movedim(layout.outputs[0], 0) * batch  # (B, ...), summed loss
            if any(t.dtype != dtype for t in (a, g_sum) if t.is_floating_point()):  # autocast
                a, g_sum = (t.to(dtype) if t.is_floating_point() else t for t in (a, g_sum))
            factored = self.factored and not several and not call.in_place
            factors = rule.factors(layer, a, g_sum) if factored else None
            if rule.weighted_sum is not None and not several and not factors:
                self._sums[id(layer.weight)] = partial(rule.weighted_sum, layer, a, g_sum)
            copies = call.weight_copies[:1] if layout.inputs[0] == 0 else []  # autograd's
            return factors or rule.per_sample(layer, a, g_sum, out, *copies)
        return self.layers.fallbacks[name].per_sample(call, layout, batch, out)  # hooks idle

    def _buffer_views(self, batch: int, params: dict[str, nn.Parameter], calls: dict) -> Grads:
        """:meth:`GradBuffer.views` in the dtype and device of the calls' floating tensors."""
        if self.grad_buffer is None:
            return {}
        kinds = {
            (t.dtype, t.device)
            for layer_calls in calls.values()
            for call in layer_calls
            for t in (*call.leaves[:1], *call.grads)
            if isinstance(t, torch.Tensor) and t.is_floating_point()  # not Embedding's indices
        }
        return self.grad_buffer.views(batch, params, kinds.pop()) if len(kinds) == 1 else {}


def _added(rows: Any, more: Any, shape: torch.Size) -> Any:
    """The sum ``(B, *shape)`` of the rows of a parameter two layers share (compact ones dense)."""
    if rows is None or more is None:
        return more if rows is None else rows
    return part_rows(rows).view(-1, *shape).add_(part_rows(more).view(-1, *shape))


class GradBuffer:
    """One row-major ``(rows >= B, d)`` buffer and its per-parameter ``(B, *shape)`` views, in
    ``named_parameters`` order: consecutive column blocks, which ``as_batch_grads`` makes one."""

    def __init__(self) -> None:
        self.buffer: torch.Tensor | None = None  # (rows >= B, d)
        #: the layout: per trainable parameter, (name, the parameter object's id, its shape)
        self._layout: list[tuple[str, int, torch.Size]] = []
        self._views: dict[int, Grads] = {}  # B -> name -> (B, *shape) views of the buffer

    def views(self, batch: int, params: dict[str, nn.Parameter], kind: tuple) -> Grads:
        """Name -> ``(B, *shape)`` column blocks of the buffer of ``kind``, ``(dtype, device)``."""
        buffer, (dtype, device) = self.buffer, kind
        layout = [(n, id(p), p.shape) for n, p in params.items()]
        if layout != self._layout:  # first call, or parameters were (un)frozen or replaced
            self._layout, buffer = layout, None
        if buffer is None or len(buffer) < batch or (buffer.dtype, buffer.device) != kind:
            d = sum(shape.numel() for _, _, shape in layout)
            self.buffer = torch.empty(batch, d, dtype=dtype, device=device)  # (B, d)
            self._views = {}
        if batch not in self._views:
            widths = [shape.numel() for _, _, shape in layout]
            blocks = torch.split(self.buffer[:batch], widths, dim=1)  # (B, d_i) each
            self._views[batch] = {
                n: block.view(batch, *shape)
                for (n, _, shape), block in zip(layout, blocks, strict=True)
            }
        return self._views[batch]
