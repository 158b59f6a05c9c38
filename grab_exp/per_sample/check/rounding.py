"""What a check allows for its dtype's own rounding, where it compares two float32 computations of
one quantity and finds them apart by more than its tolerance: near an optimum, gradients and
outputs cancel (a batch's gradient that is a sum of examples' gradients pointing apart, an output
``w.h + b`` near 0, a label-smoothed loss's gradient at its target), and any two computations of
them differ by the rounding of the terms that cancel. Each measure is taken only then, on the
batch of the call, against float64, or the check is judged again in float64
(docs/which-models-work.md)."""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.check.state import (
    forked_generators,
    generator_states,
    kept_state,
    saved_state,
    set_generator_states,
)
from grab_exp.per_sample.check.tolerance import autocast_on
from grab_exp.per_sample.layout import batch_size, call_model, take
from grab_exp.per_sample.modules import draws_random

#: a relative difference is rounding where it is at most this many times the plain computation's
#: own error against float64: two computations, each off by about that (measured: 0.9 to 1.2
#: times at LeNet fit to losses of 2e-6 to 2e-5; a label-smoothed loss near its optimum, 1.2)
ALLOWANCE = 2.0
#: the same for the examples alone, whose rounding is measured alone while the rows come from the
#: batch's backward, rounded otherwise (measured: 0.7 to 5 times at LeNet's fit); a row scaled
#: per example, where the batch's gradient cancels, stays far past it (adversarial round 28)
ALONE_ALLOWANCE = 16.0


def plain_rounding(
    model: nn.Module, loss_fn, x: Any, y: Any, names: list[str], found: Callable | None = None
) -> list[float]:
    """Per parameter of ``names``, ``|g - g64| / |g64|``: a plain step's gradient on ``x, y`` in
    the model's dtype against float64's, on copies of the model as the call found it (``found()``
    puts that state back; nothing of it stays; a copy is smaller than the ``(B, d)`` rows); zeros
    where that cannot tell (:func:`_in_both`)."""
    pair = _plain_steps(model, loss_fn, x, y, names, found)
    if pair is None:
        return [0.0] * len(names)
    return [_relative(g, h) for g, h in zip(*pair, strict=True)]


def judged_rounding(
    model: nn.Module, loss_fn, x: Any, y: Any, names: list[str], found: Callable | None = None
) -> list[float]:
    """:func:`plain_rounding`, kept for a parameter only where a float64 copy's examples, each
    alone, average to its plain step's gradient (the check judged again in float64): a loss that
    is no mean (a sum) where the float64 copy computes another function (a clamp reached only by
    float32's saturated sigmoid) is not excused (adversarial round 42). For ``loop``, whose rows
    are each example's own: its rows' mean differs from ``param.grad`` only by rounding or by
    a coupling of the examples, which float64 shows as well."""
    pair = _plain_steps(model, loss_fn, x, y, names, found)
    if pair is None:
        return [0.0] * len(names)
    errors = [_relative(g, h) for g, h in zip(*pair, strict=True)]
    if not any(errors):
        return errors
    examples = list(range(batch_size(y)))
    alone = lambda twin, x, y: _alone(twin, loss_fn, names, x, y, examples)[0]  # noqa: E731
    grads = _in_float64(model, names, x, y, alone, found)  # the pair's outputs agree
    if grads is None:
        return [0.0] * len(names)
    means = [torch.stack(each).mean(0) for each in zip(*grads, strict=True)]
    gaps = [_relative(m, w) for m, w in zip(means, pair[1], strict=True)]
    return [e if g <= JUDGED else 0.0 for e, g in zip(errors, gaps, strict=True)]


#: a float64 copy's examples average to its plain step's gradient to within this (relative)
JUDGED = 1e-9


def alone_rounding(
    model: nn.Module,
    loss_fn,
    x: Any,
    y: Any,
    names: list[str],
    chosen: list[int],
    weights,
    found: Callable | None = None,
) -> list[float]:
    """Per parameter of ``names``, ``sum_i |c_i| |g_i - g64_i|`` over the ``chosen`` examples: each
    one's gradient alone in the model's dtype against float64's, weighted by ``weights (B,)``, on a
    copy of the model (an absolute amount: the weighted sum it allows for need not cancel as the
    batch's gradient does); zeros where that cannot tell (:func:`_in_both`)."""
    alone = lambda twin, x, y: _alone(twin, loss_fn, names, x, y, chosen)  # noqa: E731
    pair, totals = _in_both(model, names, x, y, alone, found), [0.0] * len(names)
    if pair is None:
        return totals
    for i, own, exact in zip(chosen, *pair, strict=True):
        for k, (g, h) in enumerate(zip(own, exact, strict=True)):
            totals[k] += abs(float(weights[i])) * float((g.double() - h).norm())
    return totals


def _plain_steps(model: nn.Module, loss_fn, x: Any, y: Any, names: list[str], found=None):
    """A plain step's gradients of ``names`` on ``x, y``, in the model's dtype and in float64
    (:func:`_in_both`)."""

    def step(twin: nn.Module, x: Any, y: Any) -> tuple[list[torch.Tensor], Any]:
        out = call_model(twin, x)
        return _gradients(twin, names, loss_fn(out, y)), out

    return _in_both(model, names, x, y, step, found)


def _alone(twin: nn.Module, loss_fn, names: list[str], x: Any, y: Any, chosen: list[int]):
    """The gradients of ``names`` of each of the ``chosen`` examples' losses alone, each on the
    state ``twin`` had at the start, and their outputs."""
    copied = saved_state(twin)
    grads, outs = [], []
    for i in chosen:  # each one's backward before the next forward
        outs.append(copied() or call_model(twin, take(x, [i])))
        grads.append(_gradients(twin, names, loss_fn(outs[-1], take(y, [i]))))
    return grads, outs


def _copies(model: nn.Module, names: list[str], count: int, found=None) -> list | None:
    """``count`` copies of ``model`` (:func:`_twin`), made with the state ``found()`` puts back
    (the call's: a count the call's forward advanced switched a layer on in the copies); ``None``
    where none is made."""
    with kept_state(model) if found is not None else contextlib.nullcontext():
        if found is not None:
            found()
        copies = [_twin(model, names) for _ in range(count)]
    return None if any(c is None for c in copies) else copies


def _in_both(model: nn.Module, names: list[str], x: Any, y: Any, compute, found=None):
    """``compute(twin, x, y)`` on a copy of ``model`` (:func:`_copies`), then on another in
    float64 with ``x, y`` in float64, the generators forked, each drawing from their states at
    the start (not the float64 copy from where the other left them: other masks, other
    gradients); ``compute`` returns its result and the outputs it ran on. ``None`` where no copy
    is made, either raises (the user's model or loss in float64: the check refuses as it would),
    or their outputs are apart (:func:`_apart`: another function in float64, as a constant
    picked per dtype, whose gradients' difference is no rounding)."""
    if (copies := _copies(model, names, 2, found)) is None:
        return None
    twin, other = copies
    try:
        with forked_generators(), torch.enable_grad():  # both draw what the call drew
            start = generator_states()
            low, low_out = compute(twin, x, y)
            set_generator_states(start)
            high, high_out = compute(other.double(), double(x), double(y))
    except Exception:
        return None
    if _apart(low_out, high_out):  # another function in float64 (a constant per dtype)
        return None
    return low, high


#: float32 outputs further than this from float64's (relative to their largest) are another
#: function's, not rounding (~1e-7 of it; 1e-5 through a deep network)
APART = 1e-3


def _apart(low: Any, high: Any) -> bool:
    """Whether the floating leaves of two outputs differ by more than :data:`APART`, or none
    can be compared."""
    pairs = [
        (a, b)
        for a, b in zip(tree_flatten(low)[0], tree_flatten(high)[0], strict=True)
        if torch.is_tensor(a) and a.is_floating_point()
    ]
    if not pairs:  # an output no pytree opens (a dataclass): cannot tell (adversarial round 42)
        return True
    for a, b in pairs:
        scale = b.detach().abs().max().clamp_min(1e-30)
        if float((a.detach().to(b.dtype) - b.detach()).abs().max() / scale) > APART:
            return True
    return False


def _in_float64(model: nn.Module, names: list[str], x: Any, y: Any, compute, found=None):
    """``compute(twin, x, y)`` on a float64 copy of ``model`` (:func:`_copies`) and ``x, y`` in
    float64, the generators forked; ``None`` where no copy is made or it raises. For a caller
    whose :func:`_in_both` found the model's outputs and the float64 copy's alike."""
    if (copies := _copies(model, names, 1, found)) is None:
        return None
    try:
        with forked_generators(), torch.enable_grad():
            return compute(copies[0].double(), double(x), double(y))
    except Exception:
        return None


def float64_twin(model: nn.Module) -> nn.Module | None:
    """A float64 copy of ``model`` (nothing of it stays), to judge again in float64 what float32
    could not tell from its rounding; ``None`` where :func:`_twin` cannot make one."""
    twin = _twin(model, [n for n, p in model.named_parameters() if p.is_floating_point()])
    return None if twin is None else twin.double()


def loss_rounding(loss_fn, leaves: list, spec, batched: list[int], y: Any) -> float:
    """``|h - h64| / |h64|``: the gradient of ``loss_fn`` at the batched ``leaves`` (of the output
    pytree ``spec``) in their dtype against float64's; 0 where the loss does not run in float64."""
    if autocast_on():
        return 0.0
    grads = []
    try:
        for cast, targets in ((lambda t: t, y), (lambda t: t.double(), double(y))):
            copies = list(leaves)
            for i in batched:
                copies[i] = cast(leaves[i].detach()).requires_grad_()
            with torch.enable_grad():
                loss = loss_fn(tree_unflatten(copies, spec), targets)
                grads.append(torch.autograd.grad(loss, [copies[i] for i in batched]))
    except Exception:
        return 0.0
    low, high = (torch.cat([g.flatten() for g in gs]) for gs in grads)
    return _relative(low, high)


def sum_rounding(rows: BatchGrads, coef: torch.Tensor) -> list[float]:
    """Per parameter, a bound of the rounding of ``sum_i coef_i g_i`` in the rows' dtype:
    ``eps sqrt(B) sum_i |coef_i| |g_i|`` (a sum's rounding, whatever order it is taken in)."""
    eps, weights = torch.finfo(rows.like.dtype).eps, coef.abs().to(rows.like.device)  # (B,)
    scale = eps * math.sqrt(rows.rows)
    norms = [r.reshape(rows.rows, -1).norm(dim=1) for r in rows.as_dict().values()]  # (B,) each
    return [scale * float(weights @ n.to(weights.dtype)) for n in norms]


def within_rounding(
    each: list[float],
    limit: float,
    plain: list[float],
    sums: list[float],
    sizes: list[float],
    factor: float = ALLOWANCE,
) -> list[float]:
    """``each`` parameter's gap (a difference over ``sizes``), 0 where it is within ``limit`` or
    within what float32 resolves there: ``factor`` times the relative error ``plain`` of the same
    quantity's own computation (:func:`plain_rounding`, :func:`alone_rounding` over the size), or
    the bound ``sums`` of a sum's rounding (:func:`sum_rounding`) over the size."""
    triples = zip(plain, sums, sizes, strict=True)
    allowed = [max(limit, factor * e, s / max(z, 1e-300)) for e, s, z in triples]
    return [0.0 if g <= a else g for g, a in zip(each, allowed, strict=True)]


def _twin(model: nn.Module, names: list[str]) -> nn.Module | None:
    """A copy of ``model``; ``None`` where the rounding of its parameters ``names`` cannot be
    measured against float64: float64 already, under autocast, modules that draw random numbers
    (other draws, other results), or a model that cannot be copied."""
    params = dict(model.named_parameters())
    if autocast_on() or any(params[n].dtype == torch.float64 for n in names):
        return None
    if any(map(draws_random, model.modules())):
        return None
    try:
        return copy.deepcopy(model)
    except Exception:
        return None


def gradients(total: torch.Tensor, inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Autograd's gradient of ``total`` at ``inputs`` (zeros where it does not reach one)."""
    grads = torch.autograd.grad(total, inputs, allow_unused=True)
    return [torch.zeros_like(t) if g is None else g for t, g in zip(inputs, grads, strict=True)]


def _gradients(model: nn.Module, names: list[str], loss: torch.Tensor) -> list[torch.Tensor]:
    params = dict(model.named_parameters())
    return gradients(loss, [params[n] for n in names])


def _relative(low: torch.Tensor, high: torch.Tensor) -> float:
    return float((low.to(high.dtype) - high).norm() / high.norm().clamp_min(1e-300))


def double(tree: Any) -> Any:
    """``tree`` with its floating tensors in float64."""
    floating = lambda t: torch.is_tensor(t) and t.is_floating_point()  # noqa: E731
    return tree_map(lambda t: t.double() if floating(t) else t, tree)
