"""The ``GradRows`` interface: ``B`` gradient rows, read only through a few operations.

Every balance variant needs only inner products with its accumulator(s), the Gram matrix of the
batch and signed sums into an accumulator. Three kinds of rows provide them:

* :class:`DenseRows`: a materialized ``(B, w)`` matrix;
* :class:`~grab_exp.grads.linear.LinearFactors`: a Linear layer's ``g_i = sum_t delta_it a_itᵀ``;
* :class:`~grab_exp.grads.embedding.EmbeddingRows`: an Embedding's token rows, compact;
* :class:`~grab_exp.grads.batch.BatchGrads`: a batch's gradients, a concatenation of column
  blocks of the other kinds.

The vectors a variant balances (centered gradients, pair differences, unit-norm rows) are linear
combinations of the rows. The dense matrix forms them in a scratch buffer; the others keep them
lazy (:class:`Combination`) and derive their dots and Gram matrix from the rows'.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

#: ``rows -> (rows, d)`` reusable buffer, asked for only by representations that fill one
Scratch = Callable[[int], torch.Tensor]
#: a norm from a Gram matrix below ``RESOLUTION * sqrt(eps)`` of its parts' is their rounding
#: (:func:`inverse_norms`)
RESOLUTION = 8.0
_VIEWS = "_grab_views"  # the attribute that holds a kept tensor's views


@functools.cache
def constant(value: float, count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """A ``(count,)`` tensor of ``value``, made once per shape and device (never written to)."""
    return torch.full((count,), value, dtype=dtype, device=device)


@functools.cache
def _pair_weights(
    rows: int, lead: int, dtype: torch.dtype, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``W (P, B)`` and ``shift (P,)`` of :meth:`GradRows.pair_diffs` (made once per shape)."""
    pairs = (rows + lead) // 2
    index = torch.arange(pairs, device=device)[:, None]  # (P, 1)
    columns = torch.arange(rows, device=device)  # (B,)
    # elementwise, not written through an index: a scalar put on CUDA syncs with the host
    weights = (columns == 2 * index - lead).to(dtype) - (columns == 2 * index + 1 - lead).to(
        dtype
    )  # (P, B): +1 at the pair's first row (none for the lead), -1 at its second
    return weights, (index[:, 0] < lead).to(dtype)


def keep_views(tensor: torch.Tensor) -> torch.Tensor:
    """A long-lived tensor (an ordering's accumulator or scratch buffer) that keeps the views the
    ``GradRows`` operations take of it (a block's columns, a layer's weight): they are made once,
    not anew by every step. Use the returned tensor in place of ``tensor``.

    It is ``tensor`` when that is a view, else a view of all of it: the kept views then hold the
    base, not the tensor that keeps them, so no reference cycle outlives the ordering.
    """
    kept = tensor if tensor._base is not None else tensor[...]
    kept.__dict__.setdefault(_VIEWS, {})
    return kept


def kept_view(tensor: torch.Tensor, key: Hashable, make: Callable[[], Any]) -> Any:
    """``make()`` (a view, or a tuple of views, of ``tensor``), kept on ``tensor`` under ``key``
    when it is marked by :func:`keep_views` (a kept tensor view is marked too)."""
    views = tensor.__dict__.get(_VIEWS)
    if views is None:
        return make()
    view = views.get(key)
    if view is None:
        made = make()
        parts = made if isinstance(made, tuple) else (made,)
        kept = tuple(keep_views(p) if isinstance(p, torch.Tensor) else p for p in parts)
        view = views[key] = kept if isinstance(made, tuple) else kept[0]
    return view


def shaped_views(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> tuple[torch.Tensor, ...]:
    """``flat (d,)`` as consecutive views of ``shapes`` (one per parameter, in order)."""
    parts = flat.split([shape.numel() for shape in shapes])
    return tuple(part.view(shape) for part, shape in zip(parts, shapes, strict=True))


def inverse_norms(norm_sq: torch.Tensor, sizes: torch.Tensor | None = None) -> torch.Tensor:
    """``1 / |v|`` from squared norms ``(P,)`` (rounding below 0 read as 0; a zero vector's scale
    is ``1 / tiny``, so it stays 0). ``sizes (P,)``: the norms of the parts ``|v|²`` was formed
    from (a Gram matrix's entries), summed; where ``|v|`` is below ``RESOLUTION * sqrt(eps)`` of
    them, ``|v|²`` is their rounding and the scale 0 (two equal examples' difference stays zero, as
    materialized, not its rounding scaled by ``1 / tiny``)."""
    scale = norm_sq.clamp_min(0).sqrt_().clamp_min_(torch.finfo(norm_sq.dtype).tiny).reciprocal_()
    if sizes is None:
        return scale
    floor = RESOLUTION * math.sqrt(torch.finfo(norm_sq.dtype).eps) * sizes
    return scale.masked_fill_(norm_sq <= floor.square(), 0.0)


def normalize_rows(vectors: torch.Tensor) -> torch.Tensor:
    """Scale every row of a ``(B, d)`` matrix, in place, to unit norm (zero rows stay 0)."""
    norms = torch.linalg.vector_norm(vectors, dim=1, keepdim=True)  # (B, 1)
    return vectors.div_(norms.clamp_min_(torch.finfo(vectors.dtype).tiny))


class GradRows:
    """``B`` vectors of length ``d`` (rows of a per-sample gradient matrix, or combinations).

    Attributes:
        rows: ``B``.
        width: ``d`` (of a block or a whole batch; not kept by a :class:`Combination`).
        like: a tensor with the rows' dtype and device.
        factored: whether the rows are kept as factors (reading them as such saves work).
    """

    rows: int
    like: torch.Tensor
    factored = False

    def dots(self, acc: torch.Tensor) -> torch.Tensor:
        """``<g_i, acc>``: ``acc (d,)`` gives ``(B,)``; ``acc (K, d)`` gives ``(B, K)``."""
        raise NotImplementedError

    def gram(self) -> torch.Tensor:
        """The Gram matrix ``<g_i, g_j>`` ``(B, B)``."""
        raise NotImplementedError

    def dots_after_base(self, rows: torch.Tensor) -> torch.Tensor:
        """``<g_i, rows[1]>`` ``(B,)`` for ``rows (2, d)``: the centering base, then an
        accumulator. A :class:`Combination` centered on ``rows[0]`` reads its rows once for both
        (``<g_i, base>`` is part of its Gram matrix)."""
        return self.dots(rows[1])

    def accumulate(self, acc: torch.Tensor, coef: torch.Tensor) -> None:
        """In place: ``acc (d,) += sum_i coef_i g_i`` (``coef (B,)``) or ``acc (K, d) += coefᵀ G``
        (``coef (B, K)``)."""
        raise NotImplementedError

    def accumulate_and_sum(self, rows: torch.Tensor, coef: torch.Tensor, raw: GradRows) -> None:
        """In place, for ``rows (2, d)``: ``rows[0] += sum_i coef_i g_i`` (these rows, ``coef
        (B,)``) and ``rows[1] += sum_j r_j``, the sum of the ``raw`` rows they were made from (a
        :class:`Combination` of ``raw`` reads them once for both)."""
        self.accumulate(rows[0], coef)
        raw.accumulate(rows[1], constant(1.0, raw.rows, coef.dtype, coef.device))

    def write(self, out: torch.Tensor) -> None:
        """Write the rows into ``out (B, d)``."""
        raise NotImplementedError

    def dense(self, out: torch.Tensor) -> DenseRows:
        """The rows as a matrix: written into ``out (B, d)``, or their own one if they have it."""
        self.write(out)
        return DenseRows(out)

    def materialize(self) -> torch.Tensor:
        """The rows as a ``(B, d)`` matrix (their own, or a new one)."""
        return self.dense(self.like.new_empty(self.rows, self.width)).matrix

    def write_row(self, i: int, out: torch.Tensor) -> None:
        """Write row ``i`` into ``out (d,)`` (nothing of its size allocated on the way)."""
        raise NotImplementedError

    def centered_into(self, base: torch.Tensor, out: torch.Tensor) -> DenseRows:
        """``g_i - base`` (``base (d,)``) written into ``out (B, d)``."""
        self.write(out)
        return DenseRows(out.sub_(base))

    def centered(self, base: torch.Tensor, scratch: Scratch) -> GradRows:
        """``g_i - base`` (``base (d,)``); ``scratch(rows)`` gives a ``(rows, d)`` buffer the
        result may use (the factored rows never ask for one)."""
        shift = constant(-1.0, self.rows, base.dtype, base.device)  # (B,)
        return Combination(self, None, shift, base)

    def pair_diffs(self, first: torch.Tensor | None, scratch: Scratch) -> GradRows:
        """Differences of consecutive rows: ``P = (B + [first given]) // 2`` vectors.

        With ``first (d,)`` (a pending example of the previous step) it leads: the vectors are
        ``first - g_0, g_1 - g_2, ...``; else ``g_0 - g_1, g_2 - g_3, ...``. ``scratch`` as in
        :meth:`centered`.
        """
        lead = int(first is not None)
        weights, shift = _pair_weights(self.rows, lead, self.like.dtype, self.like.device)
        return Combination(self, weights, shift, first if lead else None)

    def normalized(self) -> GradRows:
        """The rows scaled to unit norm (zero rows stay 0); may work in place."""
        raise NotImplementedError


class DenseRows(GradRows):
    """The materialized ``(B, d)`` matrix ``matrix``."""

    def __init__(self, matrix: torch.Tensor, gram: torch.Tensor | None = None) -> None:
        self.matrix = self.like = matrix  # (B, d)
        self.rows, self.width = matrix.shape
        self._gram = gram  # (B, B) when known already (from the factors the rows came from)

    def to(self, device: torch.device, dtype: torch.dtype) -> DenseRows:
        return DenseRows(self.matrix.to(device, dtype))

    def dots(self, acc):
        if acc.dim() == 1:
            return self.matrix @ acc  # (B,)
        return (acc @ self.matrix.T).T  # (B, K) (this order: the faster GEMM)

    def gram(self):
        if self._gram is None:
            self._gram = self.matrix @ self.matrix.T  # (B, B)
        return self._gram

    def accumulate(self, acc, coef):
        if acc.dim() == 1:
            acc.addmv_(self.matrix.T, coef)
        else:
            acc.addmm_(coef.T, self.matrix)

    def write(self, out):
        out.copy_(self.matrix)

    def dense(self, out):
        return self

    def materialize(self):
        return self.matrix

    def write_row(self, i, out):
        out.copy_(self.matrix[i])

    def centered_into(self, base, out):
        return DenseRows(torch.sub(self.matrix, base, out=out))  # (B, d)

    def centered(self, base, scratch):
        return self.centered_into(base, scratch(self.rows))

    def pair_diffs(self, first, scratch):
        grads = self.matrix
        if first is not None:
            grads = torch.cat([first[None], grads])  # (B + 1, d)
        pairs = grads.shape[0] // 2
        firsts, seconds = grads[0 : 2 * pairs : 2], grads[1 : 2 * pairs : 2]  # (P, d) each
        return DenseRows(torch.sub(firsts, seconds, out=scratch(pairs)))

    def normalized(self):
        # from the rows themselves, not a Gram matrix their factors gave: that one cannot tell a
        # row at rounding level (an example equal to the mean it is centered on) from zero
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
        self._sizes: torch.Tensor | None = None  # (P,) sum_j |W_pj| |g_j| + |shift_p| |base|
        self._base_dots: torch.Tensor | None = None  # (P,) W <G, base>, once computed

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

    def dots_after_base(self, rows):
        base = self.base
        same = base is not None and rows[0].data_ptr() == base.data_ptr()
        if not (same and rows[0].shape == base.shape and rows[0].stride() == base.stride()):
            return self.dots(rows[1])
        both = self._mix(self.grads.dots(rows))  # (P, 2): W <G, base>, W <G, acc>, one pass
        self._base_dots = both[:, 0]
        return both[:, 1] + self.shift * (rows[1] @ self.base)

    def gram(self):
        if self._gram is None:
            inner = self.grads.gram()  # (B, B)
            lengths = inner.diagonal().clamp_min(0).sqrt()  # (B,) |g_j|
            self._sizes = lengths if self.weights is None else self.weights.abs() @ lengths
            if self.base is not None:
                self._sizes = self._sizes + self.shift.abs() * self.base.norm()
            gram = self._mix(self._mix(inner).T)  # (P, P): W G Gᵀ Wᵀ, symmetric
            if self.base is not None:
                c = self._base_dots
                c = self._mix(self.grads.dots(self.base)) if c is None else c  # (P,)
                cross = torch.outer(c, self.shift)  # (P, P)
                gram = gram + cross + cross.T
                gram += (self.base @ self.base) * torch.outer(self.shift, self.shift)
            self._gram = gram
        return self._gram

    def _mix_coef(self, coef: torch.Tensor) -> torch.Tensor:
        """``Wᵀ coef``: the rows' coefficients ``(B, ...)`` of vector coefficients ``(P, ...)``."""
        return coef if self.weights is None else self.weights.T @ coef

    def accumulate(self, acc, coef):
        self.grads.accumulate(acc, self._mix_coef(coef))
        if self.base is not None:
            if acc.dim() == 1:
                acc.addcmul_(self.base, self.shift @ coef)  # no (d,) temporary
            else:
                acc.addr_(coef.T @ self.shift, self.base)

    def accumulate_and_sum(self, rows, coef, raw):
        if raw is not self.grads:
            return super().accumulate_and_sum(rows, coef, raw)
        mixed = self._mix_coef(coef)  # (B,)
        both = torch.stack([mixed, constant(1.0, raw.rows, coef.dtype, coef.device)], dim=1)
        raw.accumulate(rows, both)  # (B, 2): one pass over the rows
        if self.base is not None:
            rows[0].addcmul_(self.base, self.shift @ coef)

    def write(self, out):
        grads = self.grads.dense(out.new_empty(self.grads.rows, out.shape[1])).matrix
        out.copy_(self._mix(grads))  # (P, d)
        if self.base is not None:
            out.addr_(self.shift, self.base)

    def normalized(self):
        gram = self.gram()
        scale = inverse_norms(gram.diagonal(), self._sizes)  # (P,)
        weights = torch.diag(scale) if self.weights is None else self.weights * scale[:, None]
        scaled = Combination(self.grads, weights, self.shift * scale, self.base)
        scaled._gram, scaled._sizes = gram * torch.outer(scale, scale), self._sizes * scale
        return scaled
