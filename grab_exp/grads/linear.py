"""Factors of a Linear layer's per-sample gradients: ``g_i = sum_t delta_it a_itᵀ``.

``a`` is the layer's input and ``delta`` its output gradient (``t`` over a sequence; ``T = 1``
without one). Then

* ``<g_i, g_j> = sum_tt' (a_it·a_jt')(delta_it·delta_jt')``: two ``(BT, BT)`` Gram matrices;
* ``<g_i, Acc> = sum_t delta_itᵀ Acc a_it``: one ``(BT, in) x (in, out)`` GEMM and a row dot;
* ``sum_i s_i g_i = Δᵀ diag(s) A``: one GEMM the size of a weight gradient,

the identity behind "ghost clipping". :class:`~grab_exp.grads.batch.BatchGrads` joins them
with the layers that stay materialized.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch

from grab_exp.grads.rows import DenseRows, GradRows, kept_view


def factor_pays(steps: int, fan_in: int, fan_out: int) -> bool:
    """Whether a Linear layer is cheaper factored: ``T² (in + out) <= in · out`` (``T >= 1``: an
    empty sequence's rows are zeros, which every consumer reads as a matrix).

    The factored Gram matrix costs ``(BT)² (in + out)``, the materialized one ``B² in out``
    (plus writing ``B T in out`` values); their dots and sums cost the same order.
    """
    return 0 < steps * steps * (fan_in + fan_out) <= fan_in * fan_out


@dataclass(frozen=True, eq=False)
class LinearFactors(GradRows):
    """``g_i = sum_t delta[i, t] ⊗ a[i, t]``: ``a (B, T, in)``, ``delta (B, T, out)``.

    With ``bias``, the block's columns are the weight's ``out * in`` then the bias's ``out``
    (``nn.Linear``'s parameter order), whose per-sample gradient is ``sum_t delta[i, t]``: the
    factors of ``[W | b]`` are ``[a | 1]`` and ``delta``, so the bias costs no block of its own.
    Accumulators are the block's columns: ``(width,)`` or ``(K, width)``.
    """

    a: torch.Tensor  # (B, T, in)
    delta: torch.Tensor  # (B, T, out)
    bias: bool = False
    factored = True

    @property
    def rows(self) -> int:
        return self.a.shape[0]

    @property
    def like(self) -> torch.Tensor:
        return self.a

    @property
    def width(self) -> int:
        """The block's columns: ``out * in`` (+ ``out`` with the bias)."""
        fan_out = self.delta.shape[-1]
        return fan_out * (self.a.shape[-1] + self.bias)

    @cached_property
    def _flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.a.reshape(-1, self.a.shape[-1]), self.delta.reshape(-1, self.delta.shape[-1])

    def flat(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(BT, in)`` and ``(BT, out)``."""
        return self._flat

    def per_step(self, coef: torch.Tensor) -> torch.Tensor:
        """Per-example coefficients ``(B, ...)`` repeated over ``T``: ``(BT, ...)``."""
        steps = self.a.shape[1]
        if steps == 1:
            return coef
        return coef[:, None].expand(len(coef), steps, *coef.shape[1:]).reshape(-1, *coef.shape[1:])

    def to(self, device, dtype) -> LinearFactors:
        return LinearFactors(self.a.to(device, dtype), self.delta.to(device, dtype), self.bias)

    def bias_grads(self) -> torch.Tensor:
        """The bias's ``(B, out)``."""
        return self.delta.sum(dim=1)

    def write(self, out: torch.Tensor) -> None:
        weight, bias = self._split(out)  # (B, out, in), (B, out)
        weight.copy_(torch.bmm(self.delta.transpose(1, 2), self.a))  # (B, out, in)
        if bias is not None:
            bias.copy_(self.bias_grads())

    def centered_into(self, base: torch.Tensor, out: torch.Tensor) -> DenseRows:
        """``g_i - base`` written into ``out (B, width)`` in one pass (``-base + Δᵀ A``)."""
        weight, bias = self._split(out)  # (B, out, in), (B, out)
        base_weight, base_bias = self._split(base)  # (out, in), (out,)
        if self.a.shape[1] == 1:  # one outer product per example: delta_i a_iᵀ - base
            torch.addcmul(-base_weight, self.delta.transpose(1, 2), self.a, out=weight)
        else:
            torch.baddbmm(-base_weight, self.delta.transpose(1, 2), self.a, out=weight)
        if bias is not None:
            torch.sub(self.bias_grads(), base_bias, out=bias)
        return DenseRows(out)

    def write_row(self, i: int, out: torch.Tensor) -> None:
        weight, bias = self._split(out)  # (out, in), (out,)
        torch.matmul(self.delta[i].T, self.a[i], out=weight)  # (out, T) @ (T, in)
        if bias is not None:
            torch.sum(self.delta[i], 0, out=bias)

    def _split(self, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The weight ``(..., out, in)`` and bias ``(..., out)`` views of ``acc (..., width)``."""
        fan_out, fan_in = self.delta.shape[-1], self.a.shape[-1]

        def split() -> tuple[torch.Tensor, torch.Tensor | None]:
            weight = acc[..., : fan_out * fan_in].unflatten(-1, (fan_out, fan_in))
            return weight, acc[..., fan_out * fan_in :] if self.bias else None

        return kept_view(acc, ("linear", fan_out, fan_in, self.bias), split)

    def dots(self, acc: torch.Tensor) -> torch.Tensor:
        """``acc (width,)`` -> ``(B,)``; ``acc (K, width)`` -> ``(B, K)``."""
        a, delta = self.flat()  # (BT, in), (BT, out)
        rows, steps = self.a.shape[:2]
        weight, bias = self._split(acc)
        if acc.dim() == 1:  # <delta_it, W a_it + b>
            image = a @ weight.T if bias is None else torch.addmm(bias, a, weight.T)  # (BT, out)
            dots = image.mul_(delta).sum(1)  # (BT,)
            return dots if steps == 1 else dots.view(rows, steps).sum(1)  # (B,)
        image = torch.matmul(a, weight.transpose(1, 2))  # (K, BT, out)
        if bias is not None:
            image += bias[:, None, :]
        dots = image.mul_(delta).sum(2)  # (K, BT)
        return (dots if steps == 1 else dots.view(-1, rows, steps).sum(2)).T  # (B, K)

    def gram(self) -> torch.Tensor:
        """``(B, B)``."""
        a, delta = self.flat()
        inputs = a @ a.T  # (BT, BT)
        if self.bias:
            inputs += 1.0  # the bias's input is 1
        product = inputs.mul_(delta @ delta.T)  # (BT, BT)
        rows, steps = self.a.shape[:2]
        return product if steps == 1 else product.view(rows, steps, rows, steps).sum((1, 3))

    def accumulate(self, acc: torch.Tensor, coef: torch.Tensor) -> None:
        """``acc (width,) += sum_i coef_i g_i`` or ``acc (K, width) += sum_i coef_ik g_i``."""
        a, delta = self.flat()
        weights = self.per_step(coef)  # (BT,) or (BT, K)
        weight, bias = self._split(acc)
        if acc.dim() == 1:
            weight.addmm_(delta.T * weights, a)  # (out, BT) @ (BT, in)
            if bias is not None:
                bias.addmv_(delta.T, weights)
            return
        weighted = weights.T[:, :, None] * delta  # (K, BT, out)
        weight.baddbmm_(weighted.transpose(1, 2), a.expand(acc.shape[0], *a.shape))
        if bias is not None:
            bias.add_(weighted.sum(-2))


@dataclass(frozen=True)
class FactorBias:
    """The bias of a Linear layer whose weight is :class:`LinearFactors` ``factors``: what a
    rule returns for it (:class:`~grab_exp.grads.batch.BatchGrads` folds it into ``factors``)."""

    factors: LinearFactors
