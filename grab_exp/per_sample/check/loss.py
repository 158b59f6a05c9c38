"""The loss contract: ``loss_fn(out, y)`` is the batch MEAN of the examples' own losses."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.utils._pytree import tree_flatten

from grab_exp.devices import host_reads_allowed
from grab_exp.per_sample.check.tolerance import LOSS_TOLERANCE, tolerance
from grab_exp.per_sample.layout import OutputLayout, batch_size, moved, take
from grab_exp.per_sample.modules import LossContractError

#: the loss contract, in the words every loss refusal ends with
CONTRACT = (
    "per-sample gradients need loss_fn(out, y) to be the batch MEAN of per-example losses "
    "(reduction='mean', no class weight= and no ignore_index padding; weight each example "
    "yourself, e.g. (w[y] * F.cross_entropy(out, y, reduction='none')).mean()); see "
    "docs/which-models-work.md"
)


def loss_of(loss_fn: Any, out: Any, y: torch.Tensor) -> torch.Tensor:
    """``loss_fn(out, y)``, refused (:class:`.LossContractError`) unless a scalar that left
    ``out`` as it was (else the output's gradient and the checks read other numbers)."""
    tensors = [out] if isinstance(out, torch.Tensor) else tree_flatten(out)[0]  # usual: one
    versions = [(t, t._version) for t in tensors if isinstance(t, torch.Tensor)]
    loss = loss_fn(out, y)
    if moved(versions):
        raise LossContractError(
            "loss_fn changed the model's output in place (an in-place clamp_, sub_ or mul_ on "
            "it): per-sample gradients need a loss that leaves its input as it is; use the "
            "out-of-place operation (out.clamp(...), not out.clamp_(...))"
        )
    check_scalar(loss)
    return loss


def check_scalar(loss: torch.Tensor) -> None:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise LossContractError(f"loss_fn returned {shape}, not a scalar: {CONTRACT}")


def example_losses(loss_fn, out: Any, y: torch.Tensor, layout: OutputLayout) -> torch.Tensor:
    """Each example's own loss ``(B,)``, ``loss_fn`` of its slice of ``out`` (in its graph)."""
    parts = (slice(i, i + 1) for i in range(batch_size(y)))
    return torch.stack([loss_fn(layout.narrow(out, p.start, 1), take(y, p)) for p in parts])


def loss_gap(loss_fn, out: Any, y: torch.Tensor, loss: torch.Tensor, layout: OutputLayout, k: int):
    """The gap between ``B * loss`` and ``k * loss`` of the first ``k`` examples plus ``(B - k) *
    loss`` of the rest, relative to the parts' sizes (terms may cancel): zero up to rounding for
    a mean. A float on the CPU, else a ``()`` tensor; ``None`` (0) where ``loss`` is not finite."""
    rest = batch_size(y) - k
    with torch.no_grad():
        first = loss_fn(layout.narrow(out, 0, k), take(y, slice(0, k)))
        second = loss_fn(layout.narrow(out, k, rest), take(y, slice(k, k + rest)))
        if host_reads_allowed(loss.device):  # three reads, then floats
            first, second, loss = first.item(), second.item(), loss.item()
        parts, size = first * k + second * rest, abs(first) * k + abs(second) * rest
        return relative_gap(loss * (k + rest), parts, size)


def relative_gap(got, want, size):
    """``|got - want| / size`` of ``()`` tensors or floats: a float where host reads are free (the
    CPU), else a ``()`` tensor; ``None`` (or 0) when ``got``, the batch loss, is not finite."""
    if isinstance(got, torch.Tensor) and not host_reads_allowed(got.device):
        gap = (got - want).abs() / size.clamp_min(1e-30)
        return torch.where(got.isfinite(), gap, torch.zeros_like(gap))
    got, want, size = float(got), float(want), float(size)
    if not math.isfinite(got):  # a diverged step: the runner's to stop
        return None
    return abs(got - want) / max(size, 1e-30)


def loss_problem(loss: torch.Tensor, losses: torch.Tensor) -> str | None:
    """Why ``loss`` is not the mean of the examples' own ``losses (B,)`` (``None``: it is)."""
    if len(losses) < 2:
        return None
    mean, total = losses.mean().detach(), losses.sum().detach()
    limit = tolerance(LOSS_TOLERANCE, losses.dtype)
    size = losses.detach().abs().mean()  # not |mean|: the examples' terms may cancel
    if bool((loss - mean).abs() <= limit * size + 1e-12):
        return None
    if not torch.isfinite(losses).all():
        found = "some examples' own losses are not finite (an example that is all padding?)"
    elif bool((loss - total).abs() <= limit * total.abs().clamp_min(1e-12) + 1e-12):
        found = "it is their SUM"
    else:
        found = "neither their mean nor their sum"
    return (
        f"loss_fn gave {loss.item():.6g} for {len(losses)} examples whose own losses average "
        f"{mean.item():.6g} ({found}): {CONTRACT}"
    )


def refuse_gap(gap: float, dtype: torch.dtype) -> None:
    if not gap <= tolerance(LOSS_TOLERANCE, dtype):  # NaN too
        raise LossContractError(
            f"loss_fn of this batch is not the mean of its two parts' losses (relative gap "
            f"{gap:.2g}): {CONTRACT}"
        )
