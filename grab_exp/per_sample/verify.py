"""The first call's check: a path's per-sample gradients against a per-example computation.

Every path (``func``, ``hooks``, ``factored``) assumes things about the model that the model can
break without an error: that each layer treats the examples of a batch on their own, that the
batch is where the path looks for it, that the loss is the batch mean. So the first call of every
path computes the first :data:`ROWS` examples' gradients the slow, sure way, one example at a
time through the whole model, and compares: a layer whose per-sample gradients differ is refused
in one line that names it, and so is a loss that is not the batch mean of per-example losses.
It runs in float64 where the model can. Nothing of it stays: ``param.grad``, the dtypes, the
random number generators and the modules' modes are restored, and random modules (dropout) are
off while it runs, so both sides compute the same function.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from grab_exp.per_sample.modules import UnsupportedModelError, random_modules

#: a :class:`~grab_exp.per_sample.base.PerSampleGradients` (which calls :func:`verify`)
PerSampleGradients = Any

__all__ = ["ROWS", "TOLERANCE", "per_example_grads", "verify"]

#: examples of the first batch checked (a structural error shows in every example)
ROWS = 4
#: largest relative difference (to the reference's largest entry) taken as rounding, per dtype;
#: a wrong batch dimension gives differences of order 1
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-3}
LOOSE_TOLERANCE = 1e-2  # float16, bfloat16
#: a parameter's differences are relative to at least this share of the largest gradient entry
FLOOR = {torch.float64: 1e-6, torch.float32: 1e-3}
LOOSE_FLOOR = 1e-1


def verify(psg: PerSampleGradients, x: torch.Tensor, y: torch.Tensor) -> None:
    """Check ``psg`` on the batch ``x (B, ...)``, ``y (B, ...)``; leave no trace.

    The check runs in float64 (the model's float32 tensors converted there and back, exactly),
    so that rounding cannot hide a wrong gradient nor fake one; a model that cannot run in
    float64 (or a compiled path) is checked in its own dtype, with that dtype's tolerance.

    Raises:
        UnsupportedModelError: the loss is not the batch mean of per-example losses, or a
            layer's per-sample gradients differ from the per-example computation (naming it).
    """
    model = psg.model
    with _kept_state(model):
        if getattr(psg, "compile_mode", None) is None:
            try:
                with _in_float64(model):
                    _check(psg, _float64(x), _float64(y))
                return
            except (RuntimeError, TypeError):
                pass  # e.g. a layer that computes in float32 on its own: check in its dtype
        _check(psg, x, y)


def _check(psg: PerSampleGradients, x: torch.Tensor, y: torch.Tensor) -> None:
    model = psg.model
    rows = min(len(x), ROWS)
    with psg.quiet():
        losses, reference = per_example_grads(model, psg.loss_fn, x[:rows], y[:rows])
        batch_loss = psg.loss_fn(model(x[:rows]), y[:rows]).detach() if rows >= 2 else None
    mixed = None if batch_loss is None else _check_loss(batch_loss, losses)
    _, grads = psg._compute(x, y)
    got = grads.as_dict()
    if not reference:  # nothing trainable
        return
    scale = max(want.abs().max() for want in reference.values())
    for name, want in reference.items():
        _compare(model, name, got[name][:rows], want, scale, psg.method)
    if mixed is not None:
        raise UnsupportedModelError(mixed)


def _float64(t: torch.Tensor) -> torch.Tensor:
    return t.double() if t.is_floating_point() else t


@contextlib.contextmanager
def _in_float64(model: nn.Module) -> Iterator[None]:
    """The model's floating parameters and buffers in float64 in place (the same objects, so an
    optimizer's references hold), back in their dtypes afterwards (exactly: float64 holds every
    float32, float16 and bfloat16 value)."""
    tensors = [t for t in (*model.parameters(), *model.buffers()) if t.is_floating_point()]
    dtypes = [t.dtype for t in tensors]
    try:
        for t in tensors:
            t.data = t.data.double()
        yield
    finally:
        for t, dtype in zip(tensors, dtypes, strict=True):
            t.grad = None  # the check's (float64); the caller restores the ones from before
            t.data = t.data.to(dtype)


def per_example_grads(
    model: nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Each example's loss ``(R,)`` and gradients ``name -> (R, *shape)`` (trainable only), one
    example at a time through the whole model."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    rows: dict[str, list[torch.Tensor]] = {n: [] for n in params}
    losses = []
    for b in range(len(x)):
        with torch.enable_grad():
            loss = _scalar(loss_fn(model(x[b : b + 1]), y[b : b + 1]))
            grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
        losses.append(loss.detach())
        for (n, p), g in zip(params.items(), grads, strict=True):
            rows[n].append(torch.zeros_like(p) if g is None else g)
    return torch.stack(losses), {n: torch.stack(r) for n, r in rows.items()}


def _scalar(loss: torch.Tensor) -> torch.Tensor:
    """``loss``, refused unless it is a scalar (an unreduced loss is not the batch mean)."""
    if loss.dim() != 0:
        raise UnsupportedModelError(
            f"loss_fn returned shape {tuple(loss.shape)}, not a scalar: per-sample "
            "gradients need the batch MEAN of per-example losses (reduction='mean')"
        )
    return loss


def _check_loss(batch_loss: torch.Tensor, losses: torch.Tensor) -> str | None:
    """Refuse a loss of ``R`` examples that is their SUM (or not a scalar); return the problem
    when it is not their mean otherwise (a layer that mixes the examples shows the same, and is
    named first), else ``None``."""
    _scalar(batch_loss)
    tolerance = _tolerance(losses.dtype)
    mean, total = losses.mean(), losses.sum()
    if _close(batch_loss, mean, tolerance):
        return None
    found = "the SUM" if _close(batch_loss, total, tolerance) else "not the mean"
    problem = (
        f"loss_fn of {len(losses)} examples gave {batch_loss.item():.6g}, {found} of their losses "
        f"(mean {mean.item():.6g}): per-sample gradients need the batch MEAN of per-example "
        "losses (reduction='mean'), and a model that treats each example on its own"
    )
    if found == "the SUM":
        raise UnsupportedModelError(problem)
    return problem


def _compare(model, name: str, got, want, scale: torch.Tensor, method: str) -> None:
    """Refuse the layer of parameter ``name`` when ``got`` differs from ``want`` (both
    ``(R, *shape)``) by more than rounding.

    The difference is relative to the parameter's largest reference entry, but to no less than
    :data:`FLOOR` of ``scale`` (the largest entry of any parameter): a gradient that is zero up
    to rounding (an attention key's bias) is all rounding.
    """
    floor = FLOOR.get(want.dtype, LOOSE_FLOOR) * scale
    size = torch.maximum(want.abs().max(), floor).clamp_min(torch.finfo(want.dtype).tiny)
    difference = (got.to(want.dtype) - want).abs().max() / size
    if difference <= _tolerance(want.dtype):
        return
    by = "where it is zero" if scale == 0 else f"by {difference.item():.0%}"
    layer = name.rpartition(".")[0]
    label = f"{layer or '<root>'} ({type(model.get_submodule(layer)).__name__})"
    advice = "use method=func" if method != "func" else "no method supports this model"
    raise UnsupportedModelError(
        f"{label}: its per-sample gradients ({name}) differ from a per-example computation {by} "
        f"on the first batch (does it mix the examples of a batch?); {advice}"
    )


def _tolerance(dtype: torch.dtype) -> float:
    return TOLERANCE.get(dtype, LOOSE_TOLERANCE)


def _close(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    return bool((a - b).abs() <= tolerance * b.abs().clamp_min(1e-12) + 1e-12)


@contextlib.contextmanager
def _kept_state(model: nn.Module) -> Iterator[None]:
    """Random modules off, and ``param.grad`` and the generators restored afterwards."""
    quieted = [model.get_submodule(n) for n in random_modules(model)]
    grads = {p: p.grad for p in model.parameters()}
    for p in grads:
        p.grad = None
    devices = sorted({p.device.index or 0 for p in grads if p.device.type == "cuda"})
    with torch.random.fork_rng(devices=devices):
        for module in quieted:
            module.training = False  # this module only: its children keep their modes
        try:
            yield
        finally:
            for module in quieted:
                module.training = True
            for p, g in grads.items():
                p.grad = g
