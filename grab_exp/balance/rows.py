"""What the balance variants read from a step's per-sample gradients: the ``GradRows`` interface.

Every variant needs only inner products with its accumulator(s), the Gram matrix of the batch and
signed sums into an accumulator. Two representations provide them:

* :class:`DenseRows`: the materialized ``(B, d)`` matrix;
* :class:`~grab_exp.balance.factored.FactoredRows`: per layer either materialized blocks or the
  factors of ``g_i = sum_t delta_it a_itᵀ`` (no ``(B, d)`` matrix).

The vectors a variant balances (centered gradients, pair differences, unit-norm rows) are linear
combinations of the rows. The dense matrix forms them in a scratch buffer; the factored one keeps
them lazy (:class:`Combination`) and derives their dots and Gram matrix from the rows'.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grab_exp.balance.signs import normalize_rows

#: ``rows -> (rows, d)`` reusable buffer, asked for only by representations that fill one
Scratch = Callable[[int], torch.Tensor]


class GradRows:
    """``B`` vectors of length ``d`` (rows of a per-sample gradient matrix, or combinations).

    Attributes:
        rows: ``B``.
        like: a tensor with the rows' dtype and device.
    """

    rows: int
    like: torch.Tensor

    def dots(self, acc: torch.Tensor) -> torch.Tensor:
        """``<g_i, acc>``: ``acc (d,)`` gives ``(B,)``; ``acc (K, d)`` gives ``(B, K)``."""
        raise NotImplementedError

    def gram(self) -> torch.Tensor:
        """The Gram matrix ``<g_i, g_j>`` ``(B, B)``."""
        raise NotImplementedError

    def accumulate(self, acc: torch.Tensor, coef: torch.Tensor) -> None:
        """In place: ``acc (d,) += sum_i coef_i g_i`` (``coef (B,)``) or ``acc (K, d) += coefᵀ G``
        (``coef (B, K)``)."""
        raise NotImplementedError

    def dense(self, out: torch.Tensor) -> DenseRows:
        """The rows written into ``out (B, d)``."""
        raise NotImplementedError

    def row(self, i: int) -> torch.Tensor:
        """Row ``i`` ``(d,)`` (a view or a fresh tensor)."""
        raise NotImplementedError

    def centered(self, base: torch.Tensor, scratch: Scratch) -> GradRows:
        """``g_i - base`` (``base (d,)``); ``scratch(rows)`` gives a ``(rows, d)`` buffer the
        result may use (the factored rows never ask for one)."""
        shift = torch.full((self.rows,), -1.0, dtype=base.dtype, device=base.device)  # (B,)
        return Combination(self, None, shift, base)

    def pair_diffs(self, first: torch.Tensor | None, scratch: Scratch) -> GradRows:
        """Differences of consecutive rows: ``P = (B + [first given]) // 2`` vectors.

        With ``first (d,)`` (a pending example of the previous step) it leads: the vectors are
        ``first - g_0, g_1 - g_2, ...``; else ``g_0 - g_1, g_2 - g_3, ...``. ``scratch`` as in
        :meth:`centered`.
        """
        lead = int(first is not None)
        pairs = (self.rows + lead) // 2
        dtype, device = self.like.dtype, self.like.device
        # pair p is rows 2p - lead (the +1; -1 means `first`) and 2p + 1 - lead (the -1): built
        # by comparison, as an indexed write of a Python number would copy it to the device
        starts = 2 * torch.arange(pairs, device=device)[:, None] - lead  # (P, 1)
        columns = torch.arange(self.rows, device=device)  # (B,)
        weights = (columns == starts).to(dtype) - (columns == starts + 1).to(dtype)  # (P, B)
        shift = torch.zeros(pairs, dtype=dtype, device=device)  # (P,)
        shift[:lead] = 1.0
        return Combination(self, weights, shift, first if lead else None)

    def normalized(self) -> GradRows:
        """The rows scaled to unit norm (zero rows stay 0); may work in place."""
        raise NotImplementedError


class DenseRows(GradRows):
    """The materialized ``(B, d)`` matrix ``matrix``."""

    def __init__(self, matrix: torch.Tensor) -> None:
        self.matrix = matrix  # (B, d)
        self.rows = matrix.shape[0]

    def dots(self, acc):
        if acc.dim() == 1:
            return self.matrix @ acc  # (B,)
        return (acc @ self.matrix.T).T  # (B, K) (this order: the faster GEMM)

    def gram(self):
        return self.matrix @ self.matrix.T  # (B, B)

    def accumulate(self, acc, coef):
        if acc.dim() == 1:
            acc.addmv_(self.matrix.T, coef)
        else:
            acc.addmm_(coef.T, self.matrix)

    def dense(self, out):
        return self

    def row(self, i):
        return self.matrix[i]  # (d,)

    def centered(self, base, scratch):
        return DenseRows(torch.sub(self.matrix, base, out=scratch(self.rows)))  # (B, d)

    def pair_diffs(self, first, scratch):
        grads = self.matrix
        if first is not None:
            grads = torch.cat([first[None], grads])  # (B + 1, d)
        pairs = grads.shape[0] // 2
        firsts, seconds = grads[0 : 2 * pairs : 2], grads[1 : 2 * pairs : 2]  # (P, d) each
        return DenseRows(torch.sub(firsts, seconds, out=scratch(pairs)))

    def normalized(self):
        return DenseRows(normalize_rows(self.matrix))


class Combination(GradRows):
    """Lazy ``V = W G + shift ⊗ base``: ``W (P, B)`` weights of rows ``G`` (``None``: the
    identity), ``shift (P,)``, ``base (d,)`` or ``None``.

    Dots and Gram matrix come from ``G``'s (centering and pair differences are linear):
    ``<v_i, acc> = (W <G, acc>)_i + shift_i <base, acc>`` and
    ``V Vᵀ = W G Gᵀ Wᵀ + c shiftᵀ + shift cᵀ + |base|² shift shiftᵀ`` with ``c = W G base``.
    """

    def __init__(
        self,
        grads: GradRows,
        weights: torch.Tensor | None,
        shift: torch.Tensor,
        base: torch.Tensor | None,
    ) -> None:
        self.grads, self.weights, self.shift, self.base = grads, weights, shift, base
        self.rows, self.like = shift.shape[0], grads.like
        self._gram: torch.Tensor | None = None

    def _mix(self, values: torch.Tensor) -> torch.Tensor:
        """``W values`` for ``values (B, ...)``."""
        return values if self.weights is None else self.weights @ values

    def dots(self, acc):
        dots = self._mix(self.grads.dots(acc))  # (P,) or (P, K)
        if self.base is None:
            return dots
        base_dots = acc @ self.base  # () or (K,)
        return dots + (
            self.shift * base_dots if acc.dim() == 1 else torch.outer(self.shift, base_dots)
        )

    def gram(self):
        if self._gram is None:
            gram = self._mix(self._mix(self.grads.gram()).T)  # (P, P): W G Gᵀ Wᵀ, symmetric
            if self.base is not None:
                c = self._mix(self.grads.dots(self.base))  # (P,)
                cross = torch.outer(c, self.shift)  # (P, P)
                gram = gram + cross + cross.T
                gram += (self.base @ self.base) * torch.outer(self.shift, self.shift)
            self._gram = gram
        return self._gram

    def accumulate(self, acc, coef):
        mixed = coef if self.weights is None else self.weights.T @ coef  # (B,) or (B, K)
        self.grads.accumulate(acc, mixed)
        if self.base is not None:
            if acc.dim() == 1:
                acc.addcmul_(self.base, self.shift @ coef)  # no (d,) temporary
            else:
                acc.addr_(coef.T @ self.shift, self.base)

    def dense(self, out):
        grads = self.grads.dense(out.new_empty(self.grads.rows, out.shape[1])).matrix
        out.copy_(self._mix(grads))  # (P, d)
        if self.base is not None:
            out.addr_(self.shift, self.base)
        return DenseRows(out)

    def normalized(self):
        gram = self.gram()
        norms = gram.diagonal().clamp_min(0).sqrt()  # (P,)
        scale = norms.clamp_min_(torch.finfo(gram.dtype).tiny).reciprocal_()  # (P,)
        weights = torch.diag(scale) if self.weights is None else self.weights * scale[:, None]
        scaled = Combination(self.grads, weights, self.shift * scale, self.base)
        scaled._gram = gram * torch.outer(scale, scale)
        return scaled
