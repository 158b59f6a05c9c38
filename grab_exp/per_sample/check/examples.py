"""The per-example checks of a full check: identity, mixing, one example alone (:mod:`.check`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.linalg import vector_norm
from torch.utils._pytree import tree_flatten

from grab_exp.grads import BatchGrads
from grab_exp.grads.rows import kept_view, shaped_views
from grab_exp.per_sample.check.loss import example_losses
from grab_exp.per_sample.check.mean import dense, floored, gaps, rows_norms, worst_gap
from grab_exp.per_sample.check.rounding import (
    ALLOWANCE,
    ALONE_ALLOWANCE,
    double,
    float64_twin,
    gradients,
    sum_rounding,
    within_rounding,
)
from grab_exp.per_sample.check.state import (
    drew_since,
    forked_generators,
    generator_states,
    random_modules_off,
    saved_state,
)
from grab_exp.per_sample.check.tolerance import FLOOR, OUTPUT_TOLERANCE, TOLERANCE, tolerance
from grab_exp.per_sample.layout import Inputs, OutputLayout, call_model, take
from grab_exp.per_sample.modules import UnsupportedModelError, advice, first_line, label

Forward = Callable[[Inputs], Any]
#: runs that must all repeat the first one before a difference is not put down to randomness
#: (dropout over few active units draws the same masks now and then)
RANDOM_RUNS = 4


def identity_problem(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    grads: BatchGrads,
    losses: torch.Tensor,
    c: torch.Tensor,
    method: str,
) -> str | None:
    """Whether ``sum_i c_i g_i`` of the rows ``grads`` (columns: ``params``) is autograd's
    gradient of ``sum_i c_i losses_i`` (``losses (B,)`` in the batch forward's graph)."""
    want = gradients(losses.mul(c).sum(), list(params.values()))
    gap, worst = worst_gap(rows_norms(grads, want, coef=c), FLOOR)
    if gap <= tolerance(TOLERANCE, grads.like.dtype):
        return None
    name = list(params)[worst]
    return verdict(model, name.rpartition(".")[0], f"the rows of {name}", gap, method)


def alone_problem(
    forward: Forward,
    loss_fn,
    x: Inputs,
    y,
    rows: BatchGrads,
    params: dict,
    checker,
    method: str,
    rounding: Callable[[list[str], list[int], torch.Tensor], list[float]],
    layout: OutputLayout,
    model: nn.Module,
) -> str | None:
    """The rows of the examples the mixing check runs alone (``checker.groups``), weighted by the
    check's weights, against the gradient of their losses computed alone, weighted alike (a
    forward and backward of each): a backward that couples the examples (a custom
    ``autograd.Function``, a detached value of the whole batch), or rows given to other examples
    where the outputs cannot tell (a head at zero: every output alike), leaves every forward, the
    identity and the rows' mean as they are. A gap within :data:`.rounding.ALONE_ALLOWANCE` times
    the examples' own rounding alone (``rounding(names, chosen, weights)``) is allowed. Where the
    forward draws random numbers, :func:`_coupled_problem` (``layout``: the output's, ``model``
    the modules that draw)."""
    chosen = [i for group in checker.groups(rows.rows) for i in group]
    weights = checker.weights(rows.rows, rows.like)  # (B,)
    coef = torch.zeros_like(weights)
    coef[chosen] = weights[chosen]  # (B,): 0 for the examples not run alone
    tensors, shapes = list(params.values()), tuple(rows.shapes.values())
    out = checker.scratch(rows.width, rows.like)  # (d,) kept: - sum_i c_i g_i, then plus
    parts = kept_view(out, shapes, lambda: shaped_views(out, shapes))  # (*shape) views
    out.zero_()
    rows.accumulate(out, -coef)
    sizes = torch.stack(torch._foreach_norm(parts))  # (P,)

    alone = (forward, loss_fn, x, y, chosen, weights)
    if _draws(lambda: _add_alone(*alone, tensors, parts)):  # added into the kept vector
        # their gradients alone would be those of other random numbers than the rows'
        return _coupled_problem(*alone, params, rounding, layout, model, method)
    verdict = (rounding, list(params), chosen, weights, lambda: sum_rounding(rows, coef))
    each, limit = _alone_gaps(sizes, parts, rows.like.dtype, *verdict)
    gap, worst = max((gap, i) for i, gap in enumerate(each))
    if gap <= limit:
        return None
    return (
        f"the rows of {list(params)[worst]}, weighted per example, differ by {gap:.2g} (relative) "
        "from the gradient of their losses computed alone, weighted alike, whose outputs are their "
        "outputs in the batch: the batch's backward couples the examples (a custom "
        "autograd.Function, a detached value of the whole batch?), or the rows are another "
        f"example's; {advice(method)}"
    )


def _add_alone(forward, loss_fn, x, y, chosen, weights, tensors, parts) -> None:
    """Add to ``parts`` (one per tensor of ``tensors``) the gradient of each ``chosen`` example's
    loss alone times its weight (``weights (B,)``), each one's backward at once (a forward may
    move frozen weights; no ``(d,)`` sum of one's own)."""
    for i in chosen:
        with torch.enable_grad():
            loss = loss_fn(forward(take(x, [i])), take(y, [i]))
        grads = zip(gradients(weights[i] * loss, tensors), parts, strict=True)
        torch._foreach_add_(parts, [dense(g, p).to(p.dtype) for g, p in grads])


def _alone_gaps(sizes, parts, dtype, rounding, names, chosen, weights, sums):
    """Each parameter's gap, ``|parts| / sizes`` (a floor share of the largest size), within
    :data:`.rounding.ALONE_ALLOWANCE` times the examples' own rounding alone
    (``rounding(names, chosen, weights)``, absolute: over these sizes) or the bound ``sums()`` of
    a sum's rounding set to 0 (both asked only past the tolerance); and the tolerance."""
    norms = torch.stack([sizes, torch.stack(torch._foreach_norm(parts))])  # (2, P)
    each, limit = gaps(norms, FLOOR), tolerance(TOLERANCE, dtype)
    if max(each) > limit:  # cancelling to within float32's rounding?
        sizes = floored(norms[0], FLOOR).tolist()
        own = rounding(names, chosen, weights)
        own = [a / max(z, 1e-300) for a, z in zip(own, sizes, strict=True)]
        each = within_rounding(each, limit, own, sums(), sizes, ALONE_ALLOWANCE)
    return each, limit


def _coupled_problem(
    forward, loss_fn, x, y, chosen, weights, params, rounding, layout, model, method
) -> str | None:
    """:func:`alone_problem` where the forward draws random numbers (masks the examples alone
    cannot draw again, so the rows cannot be compared): with the modules that draw in eval mode,
    autograd's gradient of ``sum_i c_i loss_i`` from a forward of the batch against the examples'
    own, weighted alike, which a backward that couples the examples does not give (adversarial
    round 42: a Function's backward scaled by the batch size, behind a Dropout); ``None`` where
    the forwards draw nonetheless (random numbers outside modules)."""
    tensors, coef = list(params.values()), torch.zeros_like(weights)
    coef[chosen] = weights[chosen]  # (B,): 0 for the examples not run alone
    with random_modules_off(model), torch.enable_grad():
        start, out = generator_states(), forward(x)
        if layout.unbatched(out):  # a value of the whole batch (kl.mean()): no loss per example
            return None
        losses = example_losses(loss_fn, out, y, layout)  # (B,)
        want = gradients((losses * coef.to(losses.dtype)).sum(), tensors)
        parts = [-dense(w, t) for w, t in zip(want, tensors, strict=True)]  # - sum_i c_i g_i
        sizes = torch.stack(torch._foreach_norm(parts))  # (P,)
        _add_alone(forward, loss_fn, x, y, chosen, weights, tensors, parts)  # then plus
        if drew_since(start):
            return None
        zeros = lambda: [0.0] * len(tensors)  # noqa: E731
        verdict = (rounding, list(params), chosen, weights, zeros)
        each, limit = _alone_gaps(sizes, parts, losses.dtype, *verdict)
    if max(each) <= limit:
        return None
    return (
        f"the batch's gradient of its examples' losses, weighted per example, differs by "
        f"{max(each):.2g} (relative) from the gradients of their losses computed alone, weighted "
        "alike, with the modules that draw random numbers in eval mode: the batch's backward "
        f"couples the examples (a custom autograd.Function?); {advice(method)}"
    )


#: one comparison of the identity: ``(layer, what is compared, got, want)``
Pair = tuple[str, str, torch.Tensor, torch.Tensor]


def mismatch(
    model: nn.Module,
    pairs: Iterable[Pair],
    method: str,
    tolerances: dict = TOLERANCE,
    rounding: Callable[[], float] | None = None,
) -> str | None:
    """The identity's verdict over :data:`Pair` s (``got`` is overwritten): each difference relative
    to its ``want``, or a floor share of the largest ``want`` (:func:`.mean.worst_gap`); a gap
    within :data:`.rounding.ALLOWANCE` times ``rounding()``, the relative rounding of what is
    compared (asked only past the tolerance), is float32's own."""
    pairs = list(pairs)
    if not pairs:
        return None
    dtype = pairs[-1][3].dtype
    sizes = [vector_norm(want) for *_, want in pairs]
    differences = [vector_norm(g.sub_(w.to(g.dtype))).to(dtype) for *_, g, w in pairs]
    # a NaN (a diverged row) is no difference, as the loss that is not finite stops training
    gap, worst = worst_gap(torch.stack(sizes + differences).view(2, -1), FLOOR, nan=0.0)
    if gap <= tolerance(tolerances, dtype) or (rounding and gap <= ALLOWANCE * rounding()):
        return None
    return verdict(model, *pairs[worst][:2], gap, method)


def verdict(model: nn.Module, layer: str, subject: str, difference: float, method: str) -> str:
    """The identity's refusal: ``subject`` of ``layer`` off by ``difference`` (relative)."""
    where = label(layer, model.get_submodule(layer))
    return (
        f"{where}: {subject}, weighted per example, do not add up to autograd's gradient of the "
        f"examples' own losses weighted alike (relative difference {difference:.2g}): the rows "
        f"are not those of the examples they are given for; {advice(method)}"
    )


def mixing_problem(
    forward: Forward,
    x: Inputs,
    out: Any,
    layout: OutputLayout,
    groups: list[list[int]],
    model: nn.Module,
    found: Callable[[], Any],
) -> str | None:
    """Whether examples run alone (``groups``, a forward each) get their outputs in the batch's
    ``out``; a difference that goes in eval mode is randomness if other runs draw differently.
    ``forward`` runs on the state the call found, which ``found()`` puts back."""
    chosen = [i for group in groups for i in group]
    tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    index = torch.tensor(chosen, device=tensors[0].device if tensors else torch.device("cpu"))

    def alone() -> torch.Tensor:  # each run draws anew from the (forked) generators
        parts = []
        with torch.no_grad():
            for group in groups:
                try:
                    parts.append(_rows_of(forward(take(x, group)), layout, len(group) == 1))
                except Exception as error:  # the definition of an example's gradient needs it
                    cause = first_line(error)
                    raise UnsupportedModelError(
                        f"the model fails on {len(group)} example(s) alone ({cause}): an "
                        "example's gradient is that of its loss computed alone"
                    ) from error
                if parts[-1].shape[1] != in_batch.shape[1]:
                    raise UnsupportedModelError(
                        f"examples {group} run alone get {parts[-1].shape[1]} output values, "
                        f"not {in_batch.shape[1]}: the output is not a row per example"
                    )
        return torch.cat(parts)

    in_batch = _rows_of(layout.select(out, index), layout).detach()
    # no leaf the batch splits (a dataclass: the values' check compares), or a diverged step
    # (nothing to compare; the runner stops on its loss)
    if in_batch.dim() < 2 or not in_batch.isfinite().all():
        return None
    with forked_generators():
        first = alone()
        difference, limit = (
            _relative_rows(first, in_batch),
            tolerance(OUTPUT_TOLERANCE, in_batch.dtype),
        )
        if difference <= limit:
            return None
        found()  # the float64 twin's state: the call's (a first call's calibration from the batch)
        if _float64_alike(model, x, groups, layout, index):  # outputs cancelling to rounding
            return None
        batch = lambda: _rows_of(layout.select(forward(x), index), layout)  # noqa: E731
        mixed, drawn = _still_mixed(model, batch, alone)
        if not mixed:  # randomness explains the difference if the runs draw, and otherwise
            limit = tolerance(OUTPUT_TOLERANCE, first.dtype)
            mixed = not _draws(alone) or all(
                _relative_rows(alone(), first) <= limit for _ in range(RANDOM_RUNS)
            )
    return _mixing_refusal(chosen, difference, drawn) if mixed else None


def _still_mixed(model: nn.Module, batch: Callable, alone: Callable) -> tuple[bool, bool]:
    """Whether the outputs of ``alone()`` still differ from theirs in ``batch()`` where no module
    draws random numbers, and whether the runs drew nonetheless: first with the modules that draw
    in eval mode alone and the rest in its mode (a normalization by the batch's statistics in
    training mode only, behind a Dropout: adversarial round 42), then, unless that shows mixing
    without a draw, with the whole model in eval mode (the caller's kept_state puts the modes
    back on an error)."""

    def again() -> tuple[bool, bool]:
        with torch.no_grad():
            rows, start = batch(), generator_states()
            mixed = _relative_rows(alone(), rows) > tolerance(OUTPUT_TOLERANCE, rows.dtype)
        return mixed, mixed and drew_since(start)

    with random_modules_off(model):
        mixed, drawn = again()
    if mixed and not drawn:
        return mixed, drawn
    modes = saved_state(model, buffers=False, modes=True)
    model.eval()
    found = again()
    modes()
    return found


def _mixing_refusal(chosen: list[int], difference: float, drawn: bool) -> str:
    """The mixing check's refusal; ``drawn``: the outputs differed in eval mode too, and the
    forward drew random numbers there."""
    if drawn:
        return (
            f"examples {chosen} run alone get outputs that differ from theirs in the batch "
            f"(relative difference {difference:.2g}), and the forward draws random numbers in eval "
            "mode too (F.gumbel_softmax, torch.rand, numpy's or Python's random: not a Dropout "
            "module's), so the check cannot tell randomness from examples that mix; per-sample "
            "gradients are refused for it"
        )
    return (
        f"the model mixes the examples of a batch: examples {chosen} run alone get outputs "
        f"that differ from theirs in the batch (relative difference {difference:.2g}: batch "
        "statistics, a normalization over the batch, random numbers drawn outside a Dropout "
        "module, a calibration from the first batch (run one plain forward first)?); "
        "per-sample gradients are undefined for it"
    )


def _float64_alike(model: nn.Module, x: Inputs, groups: list[list[int]], layout, index) -> bool:
    """Whether the examples run alone get their outputs in the batch in float64 (a float64 copy of
    ``model``, each forward on its state as copied): where float32's do not, rounding of outputs
    that cancel (``w.h + b`` near 0)."""
    twin = float64_twin(model)
    if twin is None:
        return False
    copied = saved_state(twin)
    again = _mixing(lambda i: copied() or call_model(twin, i), double(x), groups, layout, index)
    return again <= tolerance(OUTPUT_TOLERANCE, torch.float64)


@torch.no_grad()
def _mixing(forward: Forward, x: Inputs, groups: list[list[int]], layout, index) -> float:
    """The relative difference between the outputs of ``groups`` each run alone and theirs in a
    ``forward`` of the batch ``x``."""
    batch = _rows_of(layout.select(forward(x), index), layout)
    alone = [_rows_of(forward(take(x, group)), layout, len(group) == 1) for group in groups]
    return _relative_rows(torch.cat(alone), batch)


def _draws(run: Callable[[], Any]) -> bool:
    """Whether ``run()`` draws from the default CPU or CUDA generators (their states move)."""
    start = generator_states()
    run()
    return drew_since(start)


def _rows_of(out: Any, layout: OutputLayout, alone: bool = False) -> torch.Tensor:
    """The floating batched leaves of ``out`` as one ``(n, -1)`` matrix, a row per example
    (``alone``: one example's, each leaf one row: ``.squeeze()`` may have taken its batch)."""
    rows = [
        t.reshape(1, -1) if alone else t.movedim(d, 0).reshape(t.shape[d], -1)
        for t, d in zip(tree_flatten(out)[0], layout.dims, strict=True)
        if d is not None and isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    return torch.cat(rows, dim=1) if rows else torch.zeros(0)


def _relative_rows(got: torch.Tensor, want: torch.Tensor) -> float:
    scale = want.abs().max().clamp_min(1e-30)
    size = vector_norm(want / scale).clamp_min(1e-30)
    return (vector_norm((got.to(want.dtype) - want) / scale) / size).item()
