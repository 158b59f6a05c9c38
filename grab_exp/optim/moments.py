"""Per-column mean and mean square of a batch's gradient rows over ``k`` groups, in one pass.

For ``B`` rows split into ``k`` consecutive groups of ``m = B / k`` (group ``c``'s mean ``g_c``)
every column ``j`` gets ``ḡ_j = (1/k) Σ_c g_cj`` and ``(1/k) Σ_c g_cj²``, the two moments of
:func:`~grab_exp.optim.gsnr.gsnr_ratios`. They are written into two ``(d,)`` vectors, block of
columns by block of columns, so that nothing of the rows' size is allocated:

* a dense ``(B, w)`` block is read once from memory: ``CACHE_VALUES`` values at a time, whose
  sum, and then whose squares' sum (through a reused buffer of that size), come from the cache
  (torch's ``var_mean`` reads once too but is 10-50x slower along the batch dimension on CPU);
* a Linear layer's factors (``g_i = Σ_t δ_it a_itᵀ``, :class:`~grab_exp.grads.LinearFactors`)
  are never materialized per example where ``T = 1`` and ``k = B``: ``Σ_i g_i = Δᵀ A`` and
  ``Σ_i g_i² = (Δ²)ᵀ A²`` (elementwise squares: ``(δ a)² = δ² a²``), two products the size of
  a weight gradient. Otherwise the ``k`` group means are one batched product ``(k, out, in)``
  (group sums of the factors' outer products), whose moments are taken as a dense block's.
"""

from __future__ import annotations

import torch

from grab_exp.grads import BatchGrads, LinearFactors
from grab_exp.grads.rows import GradRows

__all__ = ["CACHE_VALUES", "column_moments"]

#: values of a dense block summed, squared and summed again while they sit in the cache
CACHE_VALUES = 1 << 17


def column_moments(
    blocks: list[tuple[slice, GradRows]], d: int, k: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ḡ (d,)`` and ``(1/k) Σ_c g_c² (d,)`` of column blocks over ``k`` groups.

    Args:
        blocks: ``(columns, rows)`` pairs: the block's slice of the ``d`` columns and its ``B``
            rows, a :class:`~grab_exp.grads.DenseRows` or
            :class:`~grab_exp.grads.LinearFactors` (any other ``GradRows`` is materialized).
        d: total columns.
        k: groups (dividing ``B``).
        dtype: of the moments (float32 or float64); the rows are cast block by block.

    Returns:
        ``(mean, second)``, each ``# (d,)``.
    """
    device = blocks[0][1].like.device
    mean = torch.empty(d, dtype=dtype, device=device)  # (d,)
    second = torch.empty(d, dtype=dtype, device=device)  # (d,)
    for columns, rows in blocks:
        if columns.stop == columns.start:
            continue
        out = mean[columns], second[columns]
        if isinstance(rows, LinearFactors):
            _factor_moments(rows, k, dtype, *out)
            continue
        _dense_moments(rows.materialize(), k, *out)
    return mean, second


def _dense_moments(x: torch.Tensor, k: int, mean: torch.Tensor, second: torch.Tensor) -> None:
    """Moments of ``x # (B, w)`` into ``mean, second # (w,)`` (their dtype), ``CACHE_VALUES``
    values at a time."""
    batch, width = x.shape
    step = max(1, CACHE_VALUES // batch)
    buffer = mean.new_empty(min(step, width) * k)  # the squares of one block
    for start in range(0, width, step):
        stop = min(start + step, width)
        block = x[:, start:stop].to(mean.dtype)  # (B, c): a view where x is in that dtype
        if k < batch:
            block = block.reshape(k, batch // k, stop - start).mean(dim=1)  # (k, c) group means
        squares = buffer[: block.numel()].view(block.shape)  # (k, c)
        torch.mean(block, 0, out=mean[start:stop])
        torch.mean(torch.mul(block, block, out=squares), 0, out=second[start:stop])


def _factor_moments(
    factors: LinearFactors, k: int, dtype: torch.dtype, mean: torch.Tensor, second: torch.Tensor
) -> None:
    """Moments of a Linear layer's factored rows (see the module docstring)."""
    a, delta = factors.a.to(dtype), factors.delta.to(dtype)  # (B, T, in), (B, T, out)
    batch, steps = a.shape[:2]
    fan_out, fan_in = delta.shape[-1], a.shape[-1]
    if steps > 1 or k < batch:  # the k group means, then their moments
        per_group = batch // k * steps
        a, delta = a.reshape(k, per_group, fan_in), delta.reshape(k, per_group, fan_out)
        groups = torch.empty(k, factors.width, dtype=dtype, device=a.device)  # (k, width)
        weights = groups[:, : fan_out * fan_in].view(k, fan_out, fan_in)
        torch.baddbmm(weights, delta.transpose(1, 2), a, beta=0, alpha=k / batch, out=weights)
        if factors.bias:
            torch.sum(delta, 1, out=groups[:, fan_out * fan_in :]).div_(batch // k)
        _dense_moments(groups, k, mean, second)
        return
    a, delta = a[:, 0], delta[:, 0]  # (B, in), (B, out)
    weight = fan_out * fan_in
    means = mean[:weight].view(fan_out, fan_in)
    seconds = second[:weight].view(fan_out, fan_in)
    # beta = 0: the output's old values are not read; alpha: the 1 / B inside the product
    torch.addmm(means, delta.T, a, beta=0, alpha=1 / batch, out=means)
    squared = delta * delta  # (B, out)
    torch.addmm(seconds, squared.T, a * a, beta=0, alpha=1 / batch, out=seconds)
    if factors.bias:
        torch.mean(delta, 0, out=mean[weight:])
        torch.mean(squared, 0, out=second[weight:])


def grad_blocks(grads: BatchGrads) -> list[tuple[slice, GradRows]]:
    """A :class:`~grab_exp.grads.BatchGrads`' column blocks with their columns."""
    return list(zip(grads.columns, grads.blocks, strict=True))
