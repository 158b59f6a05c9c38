"""GSNR (gradient signal-to-noise ratio) statistics from per-sample gradients.

VRGD (Jiang et al., 2023, arXiv:2309.13681) scales every parameter element's step by its GSNR,
measured across ``k`` groups of the step's batch. The per-sample gradients the functional
pipeline already computes (``torch.func`` ``vmap(grad)``) are enough: no second backward pass.

For one parameter element ``j`` and the group-mean gradients ``g_1 .. g_k``::

    ḡ  = (1/k) Σ_d g_d                       (the batch's mean gradient, i.e. ``p.grad``)
    σ² = max((1/k) Σ_d g_d² − ḡ², 0)          (population variance across the groups)
    r  = ḡ² / (σ² + ε)

then, per parameter tensor (every weight and every bias is its own "layer"), ``r`` is divided by
its mean over the tensor and clipped to ``[γ, 1]``.

``σ²`` is computed with exactly this formula, from the two moments that
:func:`~grab_exp.optim.moments.column_moments` takes in one pass over the rows (a Linear
layer's factored rows from its factors, never per example), in float32 for float32 gradients.
(``torch.var_mean`` would avoid the cancellation but is 10-50x slower along the batch dimension
on CPU.) The cancellation costs little here: the relative error of ``σ²`` is about
``1e-7 · (1 + r)``, so it matters only where ``r ≳ 1e5`` - elements far above their tensor's
mean ratio, clipped at 1 anyway - and float64 input (the tests) is exact to ~1e-16 · (1 + r).
The clamp at 0 removes the negative rounding residue.

**Choice of ε** (ours; the paper only says "small"): ``ε = eps · s + tiny`` where ``s`` is the
tensor's mean squared group gradient, ``mean_j (1/k) Σ_d g_d² = mean_j (σ² + ḡ²)``, and ``tiny``
is the smallest normal number of the dtype. A fixed ε (say 1e-12) is not scale-free: for a
layer whose gradients are ~1e-7, ``σ² ≪ 1e-12`` and ``r`` collapses to ``ḡ²/ε``, a different
method. With a relative ε, multiplying a layer's gradients by ``c`` leaves ``r`` unchanged, as
a signal-to-noise ratio should. ``eps = 1e-8`` (default) only matters where ``σ²`` is
negligible: a tensor whose groups agree exactly (``σ² = 0``) gets ``r = ḡ²/(eps·mean ḡ²)``,
finite and, after the division by the mean, ``ḡ²/mean ḡ²``. ``tiny`` keeps an all-zero tensor
(``ḡ = σ² = 0``) at ``r = 0`` instead of 0/0; its mean 0 is then replaced by 1 (so ``r`` stays
0 and is clipped up to ``γ``; its update ``r ⊙ ḡ`` is 0 either way). Empty tensors are skipped.

Nothing here reads a tensor's value on the host: the clip counts are device tensors, so a
training step stays free of host synchronization on CUDA.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from grab_exp.grads import BatchGrads, DenseRows, GradRows
from grab_exp.grads.rows import shaped_views
from grab_exp.optim.moments import column_moments, grad_blocks
from grab_exp.optim.settings import check_gsnr_settings, resolve_groups

__all__ = ["GSNRStats", "gsnr_ratios"]

PerSample = BatchGrads | Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor


@dataclass(frozen=True)
class GSNRStats:
    """Scaled, clipped GSNR of one step.

    Attributes:
        ratios: One tensor per parameter, in input order: shaped like the parameter
            ``# (*shape)`` for dict/sequence input, ``# (n_l,)`` chunks for matrix input. They
            are views into ``flat``.
        flat: All ratios concatenated, ``# (d,)``, values in ``[γ, 1]``.
        names: Parameter names for dict input, else ``None``.
        clip_low: Elements whose scaled ratio was below ``γ``, int64 ``# ()`` on the device.
        clip_high: Elements whose scaled ratio was above 1, int64 ``# ()`` on the device.
        numel: ``d``, the number of elements (a Python int).
    """

    ratios: list[torch.Tensor]
    flat: torch.Tensor
    names: tuple[str, ...] | None
    clip_low: torch.Tensor
    clip_high: torch.Tensor
    numel: int

    def as_dict(self) -> dict[str, torch.Tensor]:
        """Ratios by parameter name (dict input only)."""
        if self.names is None:
            raise ValueError("GSNRStats.as_dict: the per-sample gradients had no names")
        return dict(zip(self.names, self.ratios, strict=True))


def _column_blocks(
    per_sample: PerSample, sizes: Sequence[int] | None
) -> tuple[list[tuple[slice, GradRows]], list[torch.Size] | None, tuple[str, ...] | None]:
    """The rows as column blocks (:func:`~grab_exp.optim.moments.column_moments`' input), the
    parameters' shapes (``None`` for a matrix) and names (``None`` unless named)."""
    if isinstance(per_sample, BatchGrads):
        if sizes is not None:
            raise ValueError("gsnr_ratios: sizes is only for a (B, d) matrix")
        return grad_blocks(per_sample), list(per_sample.shapes.values()), tuple(per_sample.shapes)
    names = tuple(per_sample) if isinstance(per_sample, Mapping) else None
    if isinstance(per_sample, torch.Tensor):
        if per_sample.dim() != 2:
            raise ValueError(f"gsnr_ratios: a matrix must be (B, d), got {tuple(per_sample.shape)}")
        tensors, shapes = [per_sample], None
    else:
        tensors = list(per_sample.values() if isinstance(per_sample, Mapping) else per_sample)
        shapes = [g.shape[1:] for g in tensors]
        if sizes is not None:
            raise ValueError("gsnr_ratios: sizes is only for a (B, d) matrix")
    if not tensors:
        raise ValueError("gsnr_ratios: no per-sample gradients given")
    batch = tensors[0].shape[0]
    if any(g.shape[0] != batch for g in tensors):
        raise ValueError("gsnr_ratios: the per-sample gradients have different batch sizes")
    blocks, start = [], 0
    for g in tensors:
        rows = DenseRows(g.reshape(batch, math.prod(g.shape[1:])))  # (B, n)
        blocks.append((slice(start, start + rows.width), rows))
        start += rows.width
    return blocks, shapes, names


def _layer_means(x: torch.Tensor, sizes: tuple[int, ...]) -> torch.Tensor:
    """Mean of each tensor's chunk of ``x # (d,)`` -> ``# (L,)``; 0 for an empty tensor."""
    sums = torch.stack([c.sum() for c in x.split(sizes)])  # (L,)
    return sums.mul_(_inverse_sizes(sizes, x.dtype, x.device))


@functools.cache
def _inverse_sizes(sizes: tuple[int, ...], dtype: torch.dtype, device: torch.device):
    """``1 / max(n, 1)`` of each tensor's size ``# (L,)``, made once (by fills: no host copy)."""
    return torch.cat([torch.full((1,), 1 / max(n, 1), dtype=dtype, device=device) for n in sizes])


def _scaled_ratios(
    mean: torch.Tensor, second: torch.Tensor, sizes: tuple[int, ...], gamma: float, eps: float
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``r = ḡ² / (σ² + ε)`` over its tensor's mean, clipped to ``[γ, 1]``, from the moments
    ``mean, second # (d,)`` (overwritten): ``# (d,)``, and the counts clipped low and high, int64
    ``# ()``. A tensor's scalar reaches its chunk through one ``_foreach`` call for all."""
    scale = _layer_means(second, sizes).mul_(eps).add_(torch.finfo(second.dtype).tiny)  # (L,) ε
    ratio = torch.mul(mean, mean, out=mean)  # (d,) ḡ²
    var = second.sub_(ratio).clamp_min_(0)  # (d,) σ²
    torch._foreach_add_(var.split(sizes), scale.unbind())  # σ² + ε
    ratio.div_(var)  # (d,) r
    layer_mean = _layer_means(ratio, sizes)  # (L,)
    layer_mean = torch.where(layer_mean > 0, layer_mean, 1.0)
    torch._foreach_div_(ratio.split(sizes), layer_mean.unbind())
    flat = torch.clamp(ratio, gamma, 1.0, out=var)  # (d,) in [γ, 1]
    # sign(r - clipped r): 1 clipped high, -1 clipped low, else 0; its sum and its count
    # (sums of ±1 and 0: exact in float32 up to 2^24 elements, in float64 beyond)
    wide = torch.float64 if len(flat) > 2**24 else None
    clipped = ratio.sub_(flat).sign_()  # (d,)
    net = clipped.sum(dtype=wide)  # high - low
    both = clipped.abs_().sum(dtype=wide)  # high + low
    low, high = torch.stack([both - net, both + net]).div_(2).to(torch.int64).unbind()
    return flat, low, high


def gsnr_ratios(
    per_sample: PerSample,
    *,
    groups: int | None = None,
    gamma: float = 0.1,
    eps: float = 1e-8,
    sizes: Sequence[int] | None = None,
) -> GSNRStats:
    """Per-element GSNR, divided by its mean over each parameter tensor and clipped to [γ, 1].

    Args:
        per_sample: Per-sample gradients: a :class:`~grab_exp.grads.batch.BatchGrads` (what
            ``grab_exp.per_sample`` returns; read block by block, factors as factors), a dict
            name -> ``# (B, *shape)`` (what ``vmap(grad)`` returns), a sequence of
            ``# (B, *shape)`` tensors, or one matrix ``# (B, d)`` whose columns are the
            parameters concatenated.
        groups: Number of equal groups ``k`` (>= 2, dividing ``B``); ``None`` means ``k = B``.
            Groups are consecutive slices of the batch: group ``d`` holds examples
            ``d·B/k .. (d+1)·B/k − 1``.
        gamma: Lower clip, in ``(0, 1]``; ``gamma = 1`` makes every ratio exactly 1.
        eps: Relative variance regularizer (see the module docstring), > 0.
        sizes: For matrix input, the element count of each parameter (columns in order);
            ``None`` treats the whole matrix as one tensor. Not allowed with dict/sequence input.

    Returns:
        :class:`GSNRStats`, computed in float32 (or float64 for float64 input).

    Raises:
        ValueError: Bad ``gamma``/``groups``/``eps``, a batch that ``groups`` does not divide,
            tensors with different batch sizes, or ``sizes`` that do not add up to ``d``.
    """
    check_gsnr_settings(gamma, groups, eps)
    blocks, shapes, names = _column_blocks(per_sample, sizes)
    batch = blocks[0][1].rows
    k = resolve_groups(batch, groups)
    dtype = torch.promote_types(blocks[0][1].like.dtype, torch.float32)
    d = blocks[-1][0].stop
    if shapes is not None:
        sizes = [s.numel() for s in shapes]
    sizes = [d] if sizes is None else list(sizes)
    if sum(sizes) != d or any(n < 0 for n in sizes):
        raise ValueError(f"gsnr_ratios: sizes add up to {sum(sizes)}, the matrix has d = {d}")
    mean, second = column_moments(blocks, d, k, dtype)  # (d,) ḡ, (d,) (1/k) Σ_d g_d²
    flat, clip_low, clip_high = _scaled_ratios(mean, second, tuple(sizes), gamma, eps)
    ratios = list(flat.split(sizes) if shapes is None else shaped_views(flat, shapes))
    return GSNRStats(ratios, flat, names, clip_low, clip_high, d)
