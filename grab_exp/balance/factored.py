"""Factored per-sample gradients: the balance quantities without the ``(B, d)`` matrix.

A Linear layer's per-sample weight gradient is ``g_i = sum_t delta_it a_itᵀ`` (``a`` its input,
``delta`` its output gradient, ``t`` over a sequence; ``T = 1`` without one). Then

* ``<g_i, g_j> = sum_tt' (a_it·a_jt')(delta_it·delta_jt')``: two ``(BT, BT)`` Gram matrices;
* ``<g_i, Acc> = sum_t delta_itᵀ Acc a_it``: one ``(BT, out) x (out, in)`` GEMM and a row dot;
* ``sum_i s_i g_i = Δᵀ diag(s) A``: one GEMM the size of a weight gradient,

the identity behind "ghost clipping". Layers with few weights stay materialized ``(B, *shape)``
blocks and join through the same three quantities.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import torch

from grab_exp.balance.rows import DenseRows, GradRows


def factor_pays(steps: int, fan_in: int, fan_out: int) -> bool:
    """Whether a Linear layer is cheaper factored: ``T² (in + out) <= in · out``.

    The factored Gram matrix costs ``(BT)² (in + out)``, the materialized one ``B² in out``
    (plus writing ``B T in out`` values); their dots and sums cost the same order.
    """
    return steps * steps * (fan_in + fan_out) <= fan_in * fan_out


@dataclass
class LinearFactors:
    """``g_i = sum_t delta[i, t] ⊗ a[i, t]``: ``a (B, T, in)``, ``delta (B, T, out)``."""

    a: torch.Tensor  # (B, T, in)
    delta: torch.Tensor  # (B, T, out)

    def flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(BT, in)`` and ``(BT, out)``."""
        return self.a.reshape(-1, self.a.shape[-1]), self.delta.reshape(-1, self.delta.shape[-1])

    def per_step(self, coef: torch.Tensor) -> torch.Tensor:
        """Per-example coefficients ``(B, ...)`` repeated over ``T``: ``(BT, ...)``."""
        steps = self.a.shape[1]
        if steps == 1:
            return coef
        return coef[:, None].expand(len(coef), steps, *coef.shape[1:]).reshape(-1, *coef.shape[1:])

    def to(self, device, dtype) -> LinearFactors:
        return LinearFactors(self.a.to(device, dtype), self.delta.to(device, dtype))

    def materialize(self) -> torch.Tensor:
        """``(B, out, in)``."""
        return torch.bmm(self.delta.transpose(1, 2), self.a)

    def dots(self, acc: torch.Tensor) -> torch.Tensor:
        """``acc (out, in)`` -> ``(B,)``; ``acc (K, out, in)`` -> ``(B, K)``."""
        a, delta = self.flat()  # (BT, in), (BT, out)
        rows, steps = self.a.shape[:2]
        if acc.dim() == 2:
            dots = (delta @ acc).mul_(a).sum(1)  # (BT,)
            return dots if steps == 1 else dots.view(rows, steps).sum(1)  # (B,)
        dots = torch.matmul(delta, acc).mul_(a).sum(2)  # (K, BT)
        return (dots if steps == 1 else dots.view(-1, rows, steps).sum(2)).T  # (B, K)

    def gram(self) -> torch.Tensor:
        """``(B, B)``."""
        a, delta = self.flat()
        product = (a @ a.T).mul_(delta @ delta.T)  # (BT, BT)
        rows, steps = self.a.shape[:2]
        return product if steps == 1 else product.view(rows, steps, rows, steps).sum((1, 3))

    def accumulate(self, acc: torch.Tensor, coef: torch.Tensor) -> None:
        """``acc (out, in) += sum_i coef_i g_i`` or ``acc (K, out, in) += sum_i coef_ik g_i``."""
        a, delta = self.flat()
        weights = self.per_step(coef)  # (BT,) or (BT, K)
        if acc.dim() == 2:
            acc.addmm_((delta * weights[:, None]).T, a)
        else:
            weighted = weights.T[:, :, None] * delta  # (K, BT, out)
            acc.baddbmm_(weighted.transpose(1, 2), a.expand(acc.shape[0], *a.shape))


Block = torch.Tensor | LinearFactors


class FactoredGrads(GradRows, Mapping):
    """Per-sample gradients by parameter: materialized ``(B, *shape)`` or :class:`LinearFactors`.

    A ``Mapping`` name -> ``(B, *shape)``: reading an item materializes it (anew), so any code
    written for a dict of per-sample gradients works unchanged; ``Balance.step`` instead uses the
    :class:`~grab_exp.balance.rows.GradRows` operations, which never form the ``(B, d)`` matrix.

    Args:
        blocks: name -> block, in ``named_parameters`` order (the columns of ``d``).
        shapes: name -> the parameter's shape.
    """

    def __init__(self, blocks: dict[str, Block], shapes: dict[str, torch.Size]) -> None:
        self.blocks, self.shapes = blocks, shapes
        first = next(iter(blocks.values()))
        self._flat = {  # materialized blocks as (B, w), made contiguous once (a conv's is not)
            n: b.reshape(len(b), -1) for n, b in blocks.items() if not isinstance(b, LinearFactors)
        }
        self.like = first.a if isinstance(first, LinearFactors) else first
        self.rows = self.like.shape[0]
        self._columns: dict[str, slice] = {}
        start = 0
        for name, shape in shapes.items():
            self._columns[name] = slice(start, start + shape.numel())
            start += shape.numel()
        self.width = start

    # --- Mapping: materialized (B, *shape) tensors ---------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        block = self.blocks[name]
        if not isinstance(block, LinearFactors):
            return block
        return block.materialize().view(self.rows, *self.shapes[name])  # not kept: memory

    def __iter__(self) -> Iterator[str]:
        return iter(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)

    def factors(self) -> list[LinearFactors]:
        """The blocks kept as factors."""
        return [b for b in self.blocks.values() if isinstance(b, LinearFactors)]

    @property
    def factored_names(self) -> list[str]:
        """The parameters kept as factors."""
        return [n for n, b in self.blocks.items() if isinstance(b, LinearFactors)]

    def to(self, device: torch.device, dtype: torch.dtype) -> FactoredGrads:
        """The blocks on ``device`` in ``dtype`` (tensors already there are not copied)."""
        moved = {n: b.to(device, dtype) for n, b in self.blocks.items()}
        return FactoredGrads(moved, self.shapes)

    # --- GradRows ------------------------------------------------------------------------
    def _parts(self, acc: torch.Tensor) -> Iterator[tuple[Block, torch.Tensor]]:
        """Each block (factors, or materialized ``(B, w)``) with its columns of ``acc (d,)`` /
        ``(K, d)``, shaped for the block."""
        for name, block in self.blocks.items():
            part = acc[..., self._columns[name]]
            if isinstance(block, LinearFactors):
                yield block, part.unflatten(-1, self.shapes[name])  # (out, in) or (K, out, in)
            else:
                yield self._flat[name], part  # (B, w), (w,) or (K, w)

    def dots(self, acc):
        total = None
        for block, part in self._parts(acc):
            if isinstance(block, LinearFactors):
                dots = block.dots(part)
            else:
                dots = block @ part if acc.dim() == 1 else (part @ block.T).T
            total = dots if total is None else total.add_(dots)
        return total  # (B,) or (B, K)

    def gram(self):
        total = None
        for block in [*self.factors(), *self._flat.values()]:
            gram = block.gram() if isinstance(block, LinearFactors) else block @ block.T
            total = gram if total is None else total.add_(gram)
        return total  # (B, B)

    def accumulate(self, acc, coef):
        for block, part in self._parts(acc):
            if isinstance(block, LinearFactors):
                block.accumulate(part, coef)
            elif acc.dim() == 1:
                part.addmv_(block.T, coef)
            else:
                part.addmm_(coef.T, block)

    def dense(self, out):
        for name in self.blocks:
            out[:, self._columns[name]] = self[name].reshape(self.rows, -1)
        return DenseRows(out)

    def row(self, i):
        parts = []
        for block in self.blocks.values():
            if isinstance(block, LinearFactors):
                parts.append((block.delta[i].T @ block.a[i]).reshape(-1))  # (out * in,)
            else:
                parts.append(block[i].reshape(-1))
        return torch.cat(parts)  # (d,)
