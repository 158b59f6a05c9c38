"""Every call: the rows' mean (one pass over the rows, factors included) against
``param.grad``, which one ``loss.backward()`` wrote; a refusal leaves ``param.grad`` as it was."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable

import torch
from torch import nn

from grab_exp.devices import host_reads_allowed
from grab_exp.grads import BatchGrads
from grab_exp.grads.rows import constant, kept_view, shaped_views
from grab_exp.per_sample.check.rounding import sum_rounding, within_rounding
from grab_exp.per_sample.check.tolerance import (
    HELD_ROUNDING,
    MEAN_FLOOR,
    MEAN_TOLERANCE,
    TOLERANCE,
    autocast_on,
    tolerance,
)
from grab_exp.per_sample.modules import UnsupportedModelError, advice, label


class GradSnapshot(contextlib.AbstractContextManager):
    """``param.grad`` of ``params`` (the rows' columns) before a call: the call's own gradient
    after its backward, and the old ``param.grad`` put back when the block raises."""

    def __init__(self, params: Iterable[nn.Parameter]) -> None:
        self.params = list(params)
        self.saved = [None if p.grad is None else p.grad.detach().clone() for p in self.params]

    def __exit__(self, kind, error, trace) -> None:
        if kind is not None:
            for p, saved in zip(self.params, self.saved, strict=True):
                p.grad = saved

    def grads(self) -> list[torch.Tensor | None]:
        return [
            p.grad if s is None or p.grad is None else p.grad - s
            for p, s in zip(self.params, self.saved, strict=True)
        ]

    def rounding(self) -> torch.Tensor | None:
        """Per parameter ``(P,)``, a bound of :meth:`grads`' rounding (``param.grad``, which
        autograd added the call's own to, less what it held): ``HELD_ROUNDING eps |param.grad|``,
        0 where it held none; ``None`` where none held one (a step after ``zero_grad()``)."""
        if all(s is None for s in self.saved):
            return None
        pairs = zip(self.params, self.saved, strict=True)
        held = [p.new_zeros(()) if s is None else dense(p.grad, p) for p, s in pairs]
        eps = torch.finfo(held[0].dtype).eps
        return torch.stack(torch._foreach_norm(held)) * (HELD_ROUNDING * eps)


@torch.no_grad()
def rows_norms(
    rows: BatchGrads,
    grads: list[torch.Tensor | None],
    coef: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    sums: dict[str, Callable] | None = None,
) -> torch.Tensor:
    """Per parameter, ``|grad|`` and ``|grad - sum_i coef_i g_i|`` (``grad`` ``None``: zero), a
    ``(2, P)`` tensor for :func:`worst_gap`.
    ``coef (B,)``: ``1/B`` each (the rows' mean) unless given; ``out``: a ``(d,)`` scratch;
    ``sums``: name -> ``(coef, acc)`` adding that parameter's ``sum_i coef_i g_i`` to ``acc``
    from a compact form (a rule's ``weighted_sum``), in place of a pass over its rows."""
    like, batch, sums = rows.like, rows.rows, sums or {}
    shift = constant(-1 / batch, batch, like.dtype, like.device) if coef is None else -coef
    shapes = tuple(rows.shapes.values())
    acc = like.new_empty(rows.width) if out is None else out  # (d,): grad, then grad - mean
    parts = kept_view(acc, shapes, lambda: shaped_views(acc, shapes))  # (*shape) views
    wants = [dense(g, part) for g, part in zip(grads, parts, strict=True)]
    torch._foreach_copy_(parts, wants)
    rows.accumulate(acc, shift, frozenset(sums))  # one pass: acc = grad - sum_i coef_i g_i
    for k, name in enumerate(rows.shapes):
        if name in sums:
            sums[name](shift, parts[k])
    return torch.stack(torch._foreach_norm([*wants, *parts])).view(2, -1)  # (2, P)


def dense(g: torch.Tensor | None, like: torch.Tensor) -> torch.Tensor:
    """``g`` densified; zeros like ``like`` where ``g`` is ``None`` (nothing reached it)."""
    return torch.zeros_like(like) if g is None else g.to_dense() if g.is_sparse else g


def worst_gap(norms: torch.Tensor, floors: dict, nan: float = math.inf) -> tuple[float, int]:
    """The largest of :func:`gaps` and its index."""
    return max((gap, i) for i, gap in enumerate(gaps(norms, floors, nan)))


def gaps(norms: torch.Tensor, floors: dict, nan: float = math.inf) -> list[float]:
    """The gaps of ``norms (2, P)`` (sizes, differences), one read: each difference over its size,
    a size at least a ``floors`` share of the largest finite one; a NaN difference is ``nan``; 0
    where the size is not finite (a gradient of a diverged step is training's to stop on, not a
    refusal)."""
    sizes, differences = norms.tolist()
    largest = max((s for s in sizes if math.isfinite(s)), default=0.0)
    floor = max(largest * floors.get(norms.dtype, floors[None]), torch.finfo(norms.dtype).tiny)
    return [
        0.0 if not math.isfinite(s) else nan if math.isnan(d) else d / max(s, floor)
        for s, d in zip(sizes, differences, strict=True)
    ]


def device_gap(norms: torch.Tensor, floors: dict) -> torch.Tensor:
    """:func:`worst_gap`'s gap as a ``()`` tensor on the device of ``norms`` (no host read)."""
    sizes, differences = norms
    gaps = differences / floored(sizes, floors)
    return gaps.nan_to_num(nan=math.inf, posinf=math.inf).where(sizes.isfinite(), 0.0).max()


def floored(sizes: torch.Tensor, floors: dict) -> torch.Tensor:
    """``sizes (P,)``, each at least a ``floors`` share of the largest finite one (and ``tiny``)."""
    floor = sizes.where(sizes.isfinite(), 0.0).max() * floors.get(sizes.dtype, floors[None])
    return sizes.maximum(floor.clamp_min(torch.finfo(sizes.dtype).tiny))


def rows_problem(
    rows: BatchGrads,
    params: dict[str, nn.Parameter],
    snapshot: GradSnapshot,
    model: nn.Module,
    method: str,
    out: torch.Tensor | None = None,
    sums: dict[str, Callable] | None = None,
    rounding: Callable[[list[str]], list[float]] | None = None,
) -> str | torch.Tensor | None:
    """The one-line refusal when the rows' mean is not autograd's gradient (``None``: it is);
    on CUDA (no host reads in a step), the ``()`` worst gap over the tolerance, judged later.
    ``method=loop``'s rows are the definition: only the loss (or autocast's rounding) is named.
    Nothing is allowed for ``param.grad``'s rounding where it held a gradient before the call
    (:meth:`GradSnapshot.rounding`); where that rounding is at least half the difference, the
    refusal names it, and a known cause beside it (a hook that only logs is harmless). A gap within
    twice a plain step's own rounding there (``rounding(names)``, :mod:`.rounding`) is allowed."""
    if not params or rows.rows == 0:
        return None
    norms = rows_norms(rows, snapshot.grads(), out=out, sums=sums)  # (2, P)
    alone = method == "loop"  # each example's loss alone: a batch of one's rounding
    limit = tolerance(TOLERANCE if alone else MEAN_TOLERANCE, rows.like.dtype)
    if not host_reads_allowed(norms.device) and not alone:  # loop has no later check: reads now
        return device_gap(norms, MEAN_FLOOR) / limit
    each = gaps(norms, MEAN_FLOOR)
    if max(each) > limit and rounding is not None:  # cancelling to within float32's rounding?
        mean = constant(1 / rows.rows, rows.rows, rows.like.dtype, rows.like.device)  # (B,)
        sizes = floored(norms[0], MEAN_FLOOR).tolist()
        each = within_rounding(each, limit, rounding(list(params)), sum_rounding(rows, mean), sizes)
    if max(each) <= limit:
        return None
    names, causes = list(params), {}  # a parameter off with a known cause first, else the worst
    for i in [i for i, gap in enumerate(each) if gap > limit]:
        if cause := known_cause(model, names[i], params[names[i]], alone):
            causes[i] = cause
    gap, worst = max((gap, i) for i, gap in enumerate(each) if i in causes or not causes)
    name, cause = names[worst], causes.get(worst)
    layer = name.rpartition(".")[0]
    where = label(layer, model.get_submodule(layer))
    found = f"the rows' mean differs from autograd's gradient at {name} of {where} by {gap:.2g}"
    if (rounding := snapshot.rounding()) is not None:
        share = float(rounding[worst] / floored(norms[0], MEAN_FLOOR)[worst])
        if share >= gap / 2:  # no other method checks it better; a known cause may be harmless
            return (
                f"{found} (relative); {name}'s param.grad held a gradient before the call so much "
                f"larger than the call's own that their difference is rounded by up to {share:.2g}"
                f" of it, which can account for this{f' (or: {cause})' if cause else ''}; clear "
                "param.grad before the call (optimizer.zero_grad())"
            )
    return _refusal(found, cause, method)


def _refusal(found: str, cause: str | None, method: str) -> str:
    """:func:`rows_problem`'s refusal: what was ``found``, the known ``cause`` and the advice;
    ``loop``'s rows are each example's own, off only for a gradient hook or a coupled batch."""
    if method != "loop":
        return f"{found} (relative){f'; {cause}' if cause else ''}; {advice(method)}"
    if cause is not None:  # a gradient hook, which every method refuses
        return f"{found} (relative); {cause}"
    rounding = "under torch.autocast each example alone rounds otherwise, or " * autocast_on()
    return f"{found} (relative): {rounding}{NOT_A_MEAN}"


NOT_A_MEAN = (
    "the batch's gradient is not the mean of the examples' own (each one's loss computed alone), "
    "so per-sample gradients are undefined for this model and loss until what couples the "
    "examples goes (batch statistics; a loss over the batch: class weight= or ignore_index "
    "averaged over it, reduction='sum'; a gradient hook on an activation)"
)


def known_cause(model: nn.Module, name: str, param: nn.Parameter, alone: bool = False):
    """A cause the rows' mean cannot follow, where the parameter or its layer shows it (``alone``:
    rows of each example alone, ``loop``'s, which only a gradient hook leaves behind)."""
    if param._backward_hooks:
        return (
            f"{name} has a gradient hook (register_hook), which changes autograd's gradient but "
            "not the rows; per-sample rows under a gradient hook are refused on every method"
        )
    if alone:
        return None
    if "forward" in vars(model.get_submodule(name.rpartition(".")[0])):
        return "its forward was replaced on the instance (layer.forward = ...)"
    owners = [n for n, m in model.named_modules() if any(q is param for q in m.parameters(False))]
    if len(owners) > 1:
        return f"{name} is shared by {' and '.join(o or '<root>' for o in owners[:2])}"
    return None


def refuse_gradient_hooks(params: dict[str, nn.Parameter], why: str) -> None:
    """Refuse the first of ``params`` with a gradient hook, ``why`` the path cannot follow it."""
    if hooked := [n for n, p in params.items() if p._backward_hooks]:
        raise UnsupportedModelError(f"{hooked[0]} has a gradient hook (register_hook), {why}")
