"""The check every path runs, on the first call and again on later batches.

A path assumes things about the model and the loss that they can break without an error: that
each example's loss depends on that example alone, that its rows belong to the examples they are
attributed to, that the loss is the batch mean of per-example losses. One cheap identity tests
all of them at once, in the spirit of Freivalds' check: for random weights ``c (B,)``, the rows'
weighted sum ``sum_i c_i g_i`` must equal autograd's gradient of ``sum_i c_i loss_i``, where
``loss_i`` is example ``i``'s loss read from the batch's own output. One extra backward and an
``O(d)`` comparison catch rows attributed to the wrong examples, missing terms and double counting,
without a float64 copy of anything. Beside it, on the same batch:

* the loss: the batch loss must be the mean of the examples' own losses (class weights and
  ``ignore_index`` normalize by the batch, ``reduction="sum"`` adds up);
* mixing: two examples run alone must get the losses they got in the batch (a model that
  normalizes over the batch, or BatchNorm in disguise, fails it).

The hook path takes the identity at its layers' outputs where a layer has a rule: the
gradient of ``sum_i c_i loss_i`` at a layer's output must be ``c_i`` times example ``i``'s own
row of the step's output gradient (a ``(B, ...)`` comparison, no gradient of the layer's weights
formed), and the rule's closed form, tested against a per-example loop, does the rest; the
layers it replays and the parameters the loss also uses directly are compared as parameters.

:class:`Check` decides when: on the first call, on calls 2, 4, 8, ... up to ``every``, then every
``every``-th call, whenever the batch's structure changes (its :func:`~.layout.input_shapes`, a
layer's call count, the trainable set, the modules' modes), and on the first batch of at least 2
examples (one cannot show mixing). Every call, a split of the loss in two parts at a point that
moves from call to call (:func:`loss_gap`) catches weighting that shows up between checks.
``every=0`` turns all of it off; a captured step (``trainer.cuda_graph``) replays without it.

Nothing of it stays: buffers, the random number generators, the modules' modes and ``param.grad``
are as before (:func:`kept_state`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.func import vmap
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from grab_exp.devices import host_reads_allowed, in_graph_safe
from grab_exp.grads import BatchGrads
from grab_exp.per_sample.layout import Inputs, OutputLayout, batch_size, narrow, take
from grab_exp.per_sample.modules import LossContractError, UnsupportedModelError

__all__ = [
    "CHECK_EVERY",
    "OUTPUT_TOLERANCE",
    "Check",
    "ModelState",
    "example_losses",
    "identity_problem",
    "kept_state",
    "loss_gap",
    "loss_problem",
    "mismatch",
    "mixing_problem",
    "relative_gap",
]

#: the default schedule: calls 1, 2, 4, ..., 128, then every 128th (and every new structure)
CHECK_EVERY = 128
#: largest relative difference (in norm) taken as rounding, per dtype: a wrong row is off by
#: order 1; float32 sums of per-example gradients against a batched backward differ by up to
#: about 1e-3 in a ResNet-18's deeper convolutions
TOLERANCE = {torch.float64: 1e-8, torch.float32: 1e-2}
LOOSE_TOLERANCE = 5e-2  # float16, bfloat16
#: the same at a layer's outputs, where both sides come from one backward scaled per example
#: (the hook path's rule layers): rounding only, so rows swapped between two examples whose
#: weights differ by 1/B show even in float32
OUTPUT_TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}
#: a parameter's difference is relative to at least this share of the largest norm of any
FLOOR = {torch.float64: 1e-6, torch.float32: 1e-3}
LOOSE_FLOOR = 1e-1
#: losses: relative difference taken as rounding (sums of B float32 terms, other kernels)
LOSS_TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4}
#: runs that must all repeat the first one before a difference is not put down to randomness
#: (dropout over few active units draws the same masks now and then)
RANDOM_RUNS = 4
#: structure keys remembered (a run with more distinct batches checks on schedule only)
MAX_KEYS = 4096
SEED = 0x9E3779B9


class Check:
    """When to check, and what the checks found so far.

    Args:
        every: the schedule's period (``0``: no check at all).

    Attributes:
        calls: calls so far.
        checks: checks run so far.
        pending: whether no batch of at least 2 examples has been checked yet (one example
            cannot show mixing, nor a loss that is not a mean).
    """

    def __init__(self, every: int = CHECK_EVERY) -> None:
        self.every, self.calls, self.checks = every, 0, 0
        self.pending = True
        self._seen: set = set()
        self._gap: torch.Tensor | None = None  # CUDA: the loss split's largest gap, read later
        self._rows: torch.Tensor | None = None  # CUDA: the rows' worst gap / tolerance, later

    @property
    def on(self) -> bool:
        """Whether any check runs."""
        return self.every > 0

    def due(self, key: Any, batch: int) -> bool:
        """Count a call; whether its batch is checked in full (never inside a captured step,
        :func:`~grab_exp.devices.graph_safe`: its replays run no Python)."""
        if not self.on or in_graph_safe():
            return False
        self.calls += 1
        n = self.calls
        scheduled = n % self.every == 0 or (n & (n - 1) == 0 and n < self.every)
        return scheduled or key not in self._seen or (self.pending and batch >= 2)

    def passed(self, key: Any, batch: int) -> None:
        """Record a checked batch that passed."""
        self.checks += 1
        if len(self._seen) < MAX_KEYS:
            self._seen.add(key)
        self.pending = self.pending and batch < 2

    def forget(self) -> None:
        """Check the next call in full (the path's structure changed)."""
        self._seen.clear()

    def weights(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        """The check's weights ``c (B,)``: ``B`` evenly spaced values in ``[0.5, 1.5)`` in an
        order drawn from a generator of its own (the global ones are not touched): positive, so
        that nothing cancels, and at least ``1/B`` apart, so that rows swapped between any two
        examples show."""
        generator = torch.Generator().manual_seed(SEED + self.checks)
        order = torch.randperm(batch, generator=generator).to(torch.float64)
        c = 0.5 + order / batch
        return c.to(device=like.device, dtype=like.dtype)

    def split(self, batch: int) -> int | None:
        """Where this call's loss is split in two (:func:`loss_gap`): a point that moves from
        call to call, so that a weighting that balances between the two parts of one split
        shows in the next; ``None`` for ``B < 2``, with the check off, or in a captured step."""
        if batch < 2 or not self.on or in_graph_safe():
            return None
        return 1 + self.calls % (batch - 1)

    def groups(self, batch: int) -> list[list[int]]:
        """The examples the mixing check runs alone: two distinct ones together, or for a batch
        of two each on its own."""
        if batch == 2:
            return [[0], [1]]
        generator = torch.Generator().manual_seed(SEED + 1 + self.checks)
        return [torch.randperm(batch, generator=generator)[:2].tolist()]

    def settle_gap(self, gap: float | torch.Tensor | None, dtype: torch.dtype) -> None:
        """Refuse a loss whose two parts do not add up to it (:func:`loss_gap`): at once on the
        CPU; on CUDA (no host read inside a step) kept on the device for the next full check
        (:meth:`settle_deferred`)."""
        if isinstance(gap, torch.Tensor):
            self._gap = gap if self._gap is None else torch.maximum(self._gap, gap)  # NaN stays
        elif gap is not None:
            _refuse_gap(gap, dtype)

    def defer_rows(self, ratio: torch.Tensor) -> None:
        """Keep a call's rows-against-``param.grad`` gap (``()``, over its tolerance) on the
        device for the next full check (no host read inside a step)."""
        self._rows = ratio if self._rows is None else torch.maximum(self._rows, ratio)

    def settle_deferred(self, dtype: torch.dtype) -> None:
        """Refuse what the loss splits and the rows' comparisons kept on the device since the
        last full check showed (one host read each)."""
        if self._rows is not None:
            ratio, self._rows = self._rows.item(), None
            if not ratio <= 1:
                raise UnsupportedModelError(
                    f"the rows' mean differed from autograd's gradient on a call since the last "
                    f"check ({ratio:.2g} times the tolerance); use method=func"
                )
        if self._gap is not None:
            gap, self._gap = self._gap.item(), None
            _refuse_gap(gap, dtype)


def _refuse_gap(gap: float, dtype: torch.dtype) -> None:
    if not gap <= _tolerance(LOSS_TOLERANCE, dtype):  # NaN too
        raise LossContractError(
            f"loss_fn of this batch is not the mean of its two parts' losses (relative gap "
            f"{gap:.2g}): {CONTRACT}"
        )


#: the loss contract, in the words every loss refusal ends with
CONTRACT = (
    "per-sample gradients need loss_fn(out, y) to be the batch MEAN of per-example losses "
    "(reduction='mean', no class weight= and no ignore_index padding; weight each example "
    "yourself, e.g. (w[y] * F.cross_entropy(out, y, reduction='none')).mean()); see "
    "docs/which-models-work.md"
)


# ------------------------------------------------------------------------------ the loss


#: batches up to this size take their examples' losses one call at a time (cheaper than vmap's
#: set-up); larger ones under vmap where the loss allows it
LOOP_LOSSES = 32


def example_losses(loss_fn, out: Any, y: torch.Tensor, layout: OutputLayout) -> torch.Tensor:
    """Each example's own loss ``(B,)``, ``loss_fn`` of its slice of the batch's output (kept in
    the output's graph): one call per example for a small batch, else ``vmap`` where the loss
    allows it."""
    batch = batch_size(y)

    def looped() -> torch.Tensor:
        return torch.stack(
            [loss_fn(layout.narrow(out, i, 1), narrow(y, i, 1)) for i in range(batch)]
        )

    if batch <= LOOP_LOSSES:
        return looped()

    def one(out_i, y_i):
        return loss_fn(
            layout.apply(out_i, lambda t, d: t.unsqueeze(d)),
            tree_map(lambda t: t.unsqueeze(0), y_i),
        )

    try:
        dims = tree_unflatten(list(layout.dims), layout.spec)
        return vmap(one, in_dims=(dims, 0))(out, y)
    except (RuntimeError, ValueError, TypeError, NotImplementedError):
        return looped()


def loss_gap(loss_fn, out: Any, y: torch.Tensor, loss: torch.Tensor, layout: OutputLayout, k: int):
    """The relative gap between ``B * loss`` and the sum of ``k * loss`` of the first ``k``
    examples and ``(B - k) * loss`` of the rest: zero (up to rounding) for a mean of per-example
    losses (``None``, or 0 on the device, when the batch loss itself is not finite: a diverged
    step is the runner's to stop); relative to the parts' sizes (a loss whose examples' terms
    cancel, as a policy gradient's, has a mean near 0). A float where host reads are free (the
    CPU), else a ``()`` tensor."""
    batch = batch_size(y)
    if isinstance(out, torch.Tensor):  # the usual output: detached, no grad mode to switch
        first, second = _parts(loss_fn, out.detach(), y, layout, k)
    else:
        with torch.no_grad():
            first, second = _parts(loss_fn, out, y, layout, k)
    if not host_reads_allowed(loss.device):
        whole = loss.detach() * batch
        size = (first.abs() * k + second.abs() * (batch - k)).clamp_min(1e-30)
        gap = (first * k + second * (batch - k) - whole).abs() / size
        return torch.where(whole.isfinite(), gap, torch.zeros_like(gap))
    first, second, whole = first.item() * k, second.item() * (batch - k), loss.item() * batch
    if not math.isfinite(whole):  # a diverged step: the runner's to stop, not the loss's fault
        return None
    return abs(first + second - whole) / max(abs(first) + abs(second), 1e-30)


def _parts(loss_fn, out: Any, y: torch.Tensor, layout: OutputLayout, k: int) -> tuple:
    """``loss_fn`` of the first ``k`` examples and of the rest."""
    rest = batch_size(y) - k
    first = loss_fn(layout.narrow(out, 0, k), narrow(y, 0, k))
    return first, loss_fn(layout.narrow(out, k, rest), narrow(y, k, rest))


def relative_gap(got: torch.Tensor, want: torch.Tensor, size: torch.Tensor):
    """``|got - want| / size`` of ``()`` tensors: a float where host reads are free (the CPU),
    else a ``()`` tensor; nothing (``None``, or 0) when ``got``, the batch loss, is not finite."""
    if not host_reads_allowed(want.device):
        gap = (got - want).abs() / size.clamp_min(1e-30)
        return torch.where(got.isfinite(), gap, torch.zeros_like(gap))
    if not math.isfinite(got.item()):  # a diverged step: the runner's to stop
        return None
    return abs(got.item() - want.item()) / max(size.item(), 1e-30)


def loss_problem(loss: torch.Tensor, losses: torch.Tensor) -> str | None:
    """Why ``loss ()`` is not the mean of the examples' own ``losses (B,)``; ``None`` if it is."""
    if loss.dim() != 0:
        return f"loss_fn returned shape {tuple(loss.shape)}, not a scalar: {CONTRACT}"
    if len(losses) < 2:
        return None
    mean, total = losses.mean().detach(), losses.sum().detach()
    tolerance = _tolerance(LOSS_TOLERANCE, losses.dtype)
    size = losses.detach().abs().mean()  # not |mean|: the examples' terms may cancel
    if bool((loss - mean).abs() <= tolerance * size + 1e-12):
        return None
    if not torch.isfinite(losses).all():
        found = "some examples' own losses are not finite (an example that is all padding?)"
    elif _close(loss, total, tolerance):
        found = "it is their SUM"
    else:
        found = "class weights or ignore_index normalize by the batch?"
    return (
        f"loss_fn gave {loss.item():.6g} for {len(losses)} examples whose own losses average "
        f"{mean.item():.6g} ({found}): {CONTRACT}"
    )


# ------------------------------------------------------------------------------ the identity


def identity_problem(
    model: nn.Module,
    params: dict[str, nn.Parameter],
    grads: BatchGrads,
    losses: torch.Tensor,
    c: torch.Tensor,
    method: str,
) -> str | None:
    """Whether ``sum_i c_i g_i`` of the rows equals autograd's gradient of ``sum_i c_i loss_i``.

    Args:
        model: the model (to name a layer).
        params: the trainable parameters, in ``named_parameters`` order (the rows' columns).
        grads: the rows ``(B, d)``.
        losses: each example's own loss ``(B,)``, in the graph of the batch's forward.
        c: the weights ``(B,)``.
        method: the path's method (for the advice).

    Returns:
        The problem, naming the layer whose rows differ most; ``None`` if none differs.
    """
    want = torch.autograd.grad(losses.mul(c).sum(), list(params.values()), allow_unused=True)
    want = [
        torch.zeros_like(p) if w is None else w for p, w in zip(params.values(), want, strict=True)
    ]
    names = zip(params, want, strict=True)

    def pairs() -> Iterator[Pair]:
        for block in grads.blocks:
            got = c.new_zeros(block.width)  # (w,): one block's weighted sum at a time
            block.accumulate(got, c)
            start = 0
            while start < block.width:
                name, w = next(names)
                part = got[start : start + w.numel()].view_as(w)
                yield name.rpartition(".")[0], f"the rows of {name}", part, w
                start += w.numel()

    return mismatch(model, want, pairs(), method)


#: one comparison of the identity: ``(layer, what is compared, got, want)``
Pair = tuple[str, str, torch.Tensor, torch.Tensor]


def mismatch(
    model: nn.Module,
    wants: list[torch.Tensor],
    pairs: Iterable[Pair],
    method: str,
    tolerances: dict = TOLERANCE,
) -> str | None:
    """The identity's verdict over :data:`Pair` s (``got`` is overwritten): each difference's
    norm relative to its ``want``'s, but to no less than a floor share of the largest norm of
    all ``wants`` (a gradient that is zero up to rounding is all rounding).

    Returns:
        The problem naming the layer of the worst pair, ``None`` if every pair is within
        rounding.
    """
    scale = max((_norm(w) for w in wants), default=torch.tensor(0.0))
    worst, worst_pair, dtype = 0.0, None, None
    for layer, subject, got, want in pairs:
        difference = _relative(got, want, scale)
        dtype = want.dtype
        if difference > worst:
            worst, worst_pair = difference, (layer, subject)
    if worst_pair is None or worst <= tolerances.get(dtype, LOOSE_TOLERANCE):
        return None
    layer, subject = worst_pair
    label = f"{layer or '<root>'} ({type(model.get_submodule(layer)).__name__})"
    advice = "use method=func" if method != "func" else "no method supports this model"
    return (
        f"{label}: {subject}, weighted per example, do not add up to autograd's gradient of the "
        f"examples' own losses weighted alike (relative difference {worst:.2g}): the rows are "
        f"not those of the examples they are given for; {advice}"
    )


def _relative(got: torch.Tensor, want: torch.Tensor, scale: torch.Tensor) -> float:
    """``|got - want|`` relative to ``|want|`` (or the floor), in the 2-norm; ``got`` is
    overwritten (no temporary of its size)."""
    floor = FLOOR.get(want.dtype, LOOSE_FLOOR) * scale
    size = torch.maximum(_norm(want), floor).clamp_min(torch.finfo(want.dtype).tiny)
    return (_norm(got.sub_(want.to(got.dtype))) / size).item()


def _norm(t: torch.Tensor) -> torch.Tensor:
    """The 2-norm ``()`` of ``t`` (no temporary of its size)."""
    return torch.linalg.vector_norm(t)


# ------------------------------------------------------------------------------ mixing

Forward = Callable[[Inputs], Any]


def mixing_problem(
    forward: Forward,
    x: Inputs,
    out: Any,
    layout: OutputLayout,
    groups: list[list[int]],
    model: nn.Module,
) -> str | None:
    """Whether examples run alone (``groups``, each a forward of its own) get the outputs they
    got in the batch.

    ``out`` is the batch's output (training mode, with its random draws). A difference can be
    randomness (dropout) as well as mixing, so it is looked at again with the model in eval
    mode: a difference that stays is mixing; one that goes is randomness if the model draws
    differently on other runs, else mixing in training mode. Outputs, not losses, are compared:
    a loss near its minimum turns the outputs' rounding into a large relative difference.

    Returns:
        The problem; ``None`` if the examples do not mix.
    """
    chosen = [i for group in groups for i in group]
    index = torch.tensor(chosen, device=_device(out))

    def alone() -> torch.Tensor:  # each run draws anew from the (forked) generators
        parts = []
        with torch.no_grad():
            for group in groups:
                try:
                    parts.append(_rows_of(forward(take(x, group)), layout))
                except Exception as error:  # the definition of an example's gradient needs it
                    cause = (str(error).strip().splitlines() or [""])[0]
                    raise UnsupportedModelError(
                        f"the model fails on {len(group)} example(s) alone ({cause}): an "
                        "example's gradient is that of its loss computed alone"
                    ) from error
        return torch.cat(parts)

    in_batch = _rows_of(layout.select(out, index), layout).detach()
    if not in_batch.isfinite().all():
        return None  # a diverged step: nothing to compare; the runner stops on its loss
    with torch.random.fork_rng(devices=_cuda_devices(model)):
        first = alone()
        difference = _relative_rows(first, in_batch)
        if difference <= _tolerance(OUTPUT_TOLERANCE, in_batch.dtype):
            return None
        with _eval(model), torch.no_grad():
            batch = _rows_of(layout.select(forward(x), index), layout)
            mixed = _relative_rows(alone(), batch) > _tolerance(OUTPUT_TOLERANCE, batch.dtype)
        if not mixed:  # randomness explains the difference if another run draws otherwise
            tolerance = _tolerance(OUTPUT_TOLERANCE, first.dtype)
            mixed = all(_relative_rows(alone(), first) <= tolerance for _ in range(RANDOM_RUNS))
    if not mixed:
        return None
    return (
        f"the model mixes the examples of a batch: examples {chosen} run alone get outputs "
        f"that differ from theirs in the batch (relative difference {difference:.2g}: batch "
        "statistics, a normalization over the batch?); per-sample gradients are undefined for it"
    )


def _rows_of(out: Any, layout: OutputLayout) -> torch.Tensor:
    """The floating batched leaves of ``out`` as one ``(n, -1)`` matrix, a row per example."""
    leaves = tree_flatten(out)[0]
    rows = [
        t.movedim(d, 0).reshape(t.shape[d], -1)
        for t, d in zip(leaves, layout.dims, strict=True)
        if d is not None and isinstance(t, torch.Tensor) and t.is_floating_point()
    ]
    return torch.cat(rows, dim=1) if rows else torch.zeros(0)


def _relative_rows(got: torch.Tensor, want: torch.Tensor) -> float:
    """``|got - want| / |want|`` in the 2-norm, scaled first (huge outputs do not overflow)."""
    scale = want.abs().max().clamp_min(1e-30)
    size = torch.linalg.vector_norm(want / scale).clamp_min(1e-30)
    return (torch.linalg.vector_norm((got.to(want.dtype) - want) / scale) / size).item()


def _device(out: Any) -> torch.device:
    tensors = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return tensors[0].device if tensors else torch.device("cpu")


# ------------------------------------------------------------------------------ no trace


@contextlib.contextmanager
def kept_state(model: nn.Module) -> Iterator[Callable[[], list[str]]]:
    """Inside the block the model may run: its buffers (changed in place or assigned anew),
    modes, ``param.grad`` and the random number generators are put back afterwards. Yields a
    function that names the buffers changed so far."""
    buffers = [
        (m, name, b, b._version, b.detach().clone())
        for m in model.modules()
        for name, b in m._buffers.items()
        if b is not None
    ]
    modes = [(m, m.training) for m in model.modules()]
    grads = [(p, p.grad) for p in model.parameters()]
    prefix = {id(m): f"{name}." if name else "" for name, m in model.named_modules()}

    def changed() -> list[str]:
        return [
            prefix.get(id(m), "") + name
            for m, name, b, version, _ in buffers
            if m._buffers.get(name) is not b or b._version != version
        ]

    with torch.random.fork_rng(devices=_cuda_devices(model)):
        try:
            yield changed
        finally:
            with torch.no_grad():  # only the changed ones: a write would break the graphs
                for m, name, b, version, saved in buffers:  # that saved them
                    m._buffers[name] = b
                    if b._version != version:
                        b.copy_(saved)
            for m, training in modes:
                m.training = training
            for p, g in grads:
                p.grad = g


@contextlib.contextmanager
def _eval(model: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


#: modules and parameters registered anywhere so far (torch's global registration hooks): a
#: model that has not changed since a path listed it costs no walk of its module tree to know
_REGISTRATIONS = [0]


def _registered(*_: Any) -> None:
    _REGISTRATIONS[0] += 1


register_module_module_registration_hook(_registered)
register_module_parameter_registration_hook(_registered)


class ModelState:
    """The model's modules and parameters, listed once: :meth:`key` and :meth:`trainable` read
    their modes and the trainable set on every call without walking the module tree, and
    :meth:`stale` says whether a module or parameter was replaced since (then list it anew)."""

    def __init__(self, model: nn.Module) -> None:
        self.modules = list(model.modules())
        self.named = list(model.named_parameters())
        self.params = [p for _, p in self.named]
        self._seen = _REGISTRATIONS[0]

    def stale(self, model: nn.Module) -> bool:
        """Whether the model's modules or parameters are others than when listed (walked only
        when some module or parameter was registered since)."""
        if _REGISTRATIONS[0] == self._seen:
            return False
        self._seen = _REGISTRATIONS[0]
        return [id(m) for m in model.modules()] != [id(m) for m in self.modules] or [
            id(p) for p in model.parameters()
        ] != [id(p) for p in self.params]

    def trainable(self) -> dict[str, nn.Parameter]:
        """The trainable parameters by name, in ``named_parameters`` order."""
        return {n: p for n, p in self.named if p.requires_grad}

    def key(self) -> tuple:
        """The trainable set and the modules' modes (a structure key)."""
        return (
            tuple([p.requires_grad for p in self.params]),
            tuple([m.training for m in self.modules]),
        )


def _cuda_devices(model: nn.Module) -> list[int]:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})


def _tolerance(table: dict, dtype: torch.dtype) -> float:
    return table.get(dtype, LOOSE_TOLERANCE)


def _close(a: torch.Tensor, b: torch.Tensor, tolerance: float) -> bool:
    return bool((a - b).abs() <= tolerance * b.abs().clamp_min(1e-12) + 1e-12)
