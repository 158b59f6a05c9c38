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

``σ²`` is computed with exactly this formula: two column reductions over the batch (a mean and a
mean square), in float32 for float32 gradients. (``torch.var_mean`` would avoid the cancellation
but is 10-50x slower along the batch dimension on CPU.) The cancellation costs little here: the
relative error of ``σ²`` is about ``1e-7 · (1 + r)``, so it matters only where ``r ≳ 1e5`` -
elements far above their tensor's mean ratio, clipped at 1 anyway - and float64 input (the
tests) is exact to ~1e-16. The clamp at 0 removes the negative rounding residue.

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

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from grab_exp.grads import BatchGrads
from grab_exp.optim.settings import check_gsnr_settings, resolve_groups

__all__ = ["GSNRStats", "gsnr_ratios"]

PerSample = BatchGrads | Mapping[str, torch.Tensor] | Sequence[torch.Tensor] | torch.Tensor

_CPU_BLOCK = 1 << 21  # elements squared at a time on CPU (8 MiB in float32); see _mean_square


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


def _moments(g: torch.Tensor, k: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean ḡ ``# (n,)`` and mean square ``(1/k) Σ_d g_d² # (n,)`` over ``k`` groups of
    ``g # (B, n)``; each column is one reduction over the batch dimension."""
    x = g.to(dtype)  # (B, n); no copy when already in dtype
    batch, n = x.shape
    if n == 0:
        empty = x.new_zeros(0)
        return empty, empty
    if k < batch:
        x = x.reshape(k, batch // k, n).mean(dim=1)  # (k, n) group means
        return x.mean(dim=0), x.square_().mean(dim=0)  # x is our own tensor here
    return x.mean(dim=0), _mean_square(x)


def _mean_square(x: torch.Tensor) -> torch.Tensor:
    """``(1/k) Σ_d x_d²`` per column of ``x # (k, n)`` -> ``# (n,)``.

    On CPU the squares are formed ``_CPU_BLOCK`` elements at a time: a temporary above glibc's
    32 MiB mmap threshold is page-faulted in afresh on every call, which made this 4x slower
    (LeNet, B = 256). Elsewhere (CUDA's caching allocator) one temporary is cheapest.
    """
    if x.device.type != "cpu" or x.numel() <= _CPU_BLOCK:
        return x.square().mean(dim=0)
    columns = max(1, _CPU_BLOCK // x.shape[0])
    return torch.cat([c.square().mean(dim=0) for c in x.split(columns, dim=1)])


def _layer_means(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Mean of each tensor's chunk of ``x # (d,)`` -> ``# (L,)``; 0 for an empty tensor."""
    return torch.stack([c.sum() / max(n, 1) for c, n in zip(x.split(sizes), sizes, strict=True)])


def _expand(means: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Repeat ``means[l] # (L,)`` over tensor ``l``'s chunk -> ``# (d,)`` (views + one cat)."""
    return torch.cat([means[i].expand(n) for i, n in enumerate(sizes)])


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
            ``grab_exp.per_sample`` returns; read through its ``as_dict()``), a dict name ->
            ``# (B, *shape)`` (what ``vmap(grad)`` returns), a sequence of ``# (B, *shape)``
            tensors, or one matrix ``# (B, d)`` whose columns are the parameters concatenated.
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
    if isinstance(per_sample, BatchGrads):
        per_sample = per_sample.as_dict()
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
    k = resolve_groups(batch, groups)
    dtype = torch.promote_types(tensors[0].dtype, torch.float32)
    parts = [_moments(g.reshape(batch, math.prod(g.shape[1:])), k, dtype) for g in tensors]
    mean = torch.cat([m for m, _ in parts])  # (d,) ḡ
    second = torch.cat([s for _, s in parts])  # (d,) (1/k) Σ_d g_d²
    d = mean.numel()
    if shapes is not None:
        sizes = [s.numel() for s in shapes]
    sizes = [d] if sizes is None else list(sizes)
    if sum(sizes) != d or any(n < 0 for n in sizes):
        raise ValueError(f"gsnr_ratios: sizes add up to {sum(sizes)}, the matrix has d = {d}")
    signal = mean.square()  # (d,) ḡ²
    var = (second - signal).clamp_min_(0)  # (d,) σ²
    tiny = torch.finfo(dtype).tiny
    scale = _layer_means(second, sizes) * eps + tiny  # (L,) ε of each tensor
    ratio = signal / var.add_(_expand(scale, sizes))  # (d,) r = ḡ² / (σ² + ε)
    layer_mean = _layer_means(ratio, sizes)  # (L,)
    layer_mean = torch.where(layer_mean > 0, layer_mean, torch.ones_like(layer_mean))
    scaled = ratio / _expand(layer_mean, sizes)  # (d,)
    clip_low = (scaled < gamma).sum()  # () int64
    clip_high = (scaled > 1).sum()  # () int64
    flat = scaled.clamp_(gamma, 1.0)  # (d,) in [γ, 1]
    chunks = list(flat.split(sizes))
    ratios = chunks if shapes is None else [c.view(s) for c, s in zip(chunks, shapes, strict=True)]
    return GSNRStats(ratios, flat, names, clip_low, clip_high, d)
