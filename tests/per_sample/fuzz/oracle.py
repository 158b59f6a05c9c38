"""The oracle: run one case's ``psg`` over its batches against the references and name the
outcome.

Outcomes (:data:`OUTCOMES`): ``right`` (every call's loss, rows and ``p.grad`` equal the
references), ``refused`` (a one-line ``ValueError``, e.g. ``UnsupportedModelError``, that the
case allows: a feature refused by design, :data:`BY_DESIGN`, or any refusal of the hook path
asked for by name), ``unchecked`` (wrong with the checks off, ``check_every=0``, on a case
that breaks the contract by design: what the checks are for), ``false_refusal`` (a one-line
refusal of a case that must be right), ``crash`` (any other exception, or a refusal over several
lines), ``wrong`` (a call returned and its rows, ``p.grad`` or loss differ, or it raised and left
a ``p.grad``) and ``invalid`` (the reference itself failed: a fault of the generator). Only
``right``, ``refused`` and ``unchecked`` pass.
"""

from __future__ import annotations

import traceback
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

import grab_exp
from grab_exp.per_sample import UnsupportedModelError, make_per_sample

from .case import Case, draw_case
from .inputs import size
from .reference import (
    Reference,
    buffers,
    dense_grad,
    generators,
    load,
    reference,
    seeded,
    state,
)

OUTCOMES = ("right", "refused", "unchecked", "false_refusal", "crash", "wrong", "invalid")
PASSING = ("right", "refused", "unchecked")
#: features whose refusal is by design (docs/which-models-work.md: the loss contract and
#: "Refused, and what to do"; torch.func cannot transform an old-style autograd.Function)
BY_DESIGN = {
    "loss:weight_mean": "class weight= with a mean reduction",
    "loss:sum": "reduction='sum'",
    "loss:ignore": "ignore_index averaged over the batch",
    "loss:token_flat": "ignore_index averaged over the batch's tokens",
    "ckpt:reentrant": "reentrant checkpointing",
    "emb:scale_grad_by_freq": "Embedding(scale_grad_by_freq=True)",
    "sort:no_unsort": "a model that reorders its outputs (the loss contract breaks)",
    "fn:old": "an old-style autograd.Function (torch.func cannot transform it)",
    "sched:param_hook": "a gradient hook on a parameter (refused on every method)",
    "hook:param_before": "a gradient hook on a parameter (refused on every method)",
    "out:whole": "a value of the whole batch in the output, no mean of per-example terms",
    "mix:flip": "a model that mixes each example with another (the examples are not alone)",
    "mix:swap_inputs": "a model that swaps two examples' inputs (the examples are not alone)",
    "sched:mix_on": "mixup switched on between calls (the examples are not alone from then on)",
    "buf:running_mean": "a batch mean subtracted in the forward (the examples are not alone)",
    "bwd:coupled": "a backward scaled by the batch size (the examples are not alone in it)",
}
#: features refused by design on ``func`` only (``loop``, one plain forward and backward per
#: example, has none of its own: it is held to :data:`BY_DESIGN` alone)
BY_DESIGN_FUNC = {
    "rnn:GRU": "torch's vmap has no rule for GRU",
    "rnn:RNN": "torch's vmap has no rule for RNN",
    "block:share": "one module at two places",
    "buf:counter": "a forward that updates a buffer (functional_call cannot carry it out)",
    "buf:read_then_update": "a forward that updates a buffer (functional_call cannot carry it out)",
    "param:ema": "a forward that updates a frozen weight (functional_call cannot carry it out)",
    "attr:tensor_count": "a forward that changes a tensor attribute in place (a captured tensor)",
    "sched:sorted_checks": "a forward that reads its input's values in Python (.tolist())",
}
#: features refused by design on ``func`` and ``loop``, which run each example alone
BY_DESIGN_ALONE = {
    "precision:autocast": "torch.autocast (each example alone rounds otherwise)",
    "drop:masked": "dropout in training mode without randomness= (alone: other masks)",
    "drop:drawn": "a forward that draws from numpy's or Python's generator (alone: others)",
}
#: features the hook path refuses by design (``auto`` takes ``func``, then ``loop``), as it does
#: the ``rnn`` family's packed sequences: with one of :data:`BY_DESIGN_ALONE`'s, which ``func``
#: and ``loop`` refuse, no method is left on ``auto``
BY_DESIGN_HOOKS = {
    "pos:call": "a position embedding pos(arange(T))[None], its expanded output broadcast apart",
    "pos:over": "a statistic over the positions (over their copies, batched)",
    "block:scripted": "a torch.jit.script submodule",
    "block:parametrized": "a parametrized layer (torch.nn.utils.parametrize)",
    "block:fwd_hook": "a forward hook of the user's on a hooked layer",
    "sched:fwd_hook": "a forward hook of the user's on a hooked layer",
    "out:stored": "a loss reading an activation kept on the model (the identity's split)",
    "neck:swapped": "a layer called with other tensors than its parameters (functional_call)",
    "neck:vmapped": "a layer called inside the model's own torch.vmap",
    "sched:sorted_checks": "a neck that takes its batch apart, put back in an order of the data's",
}
HOOK_PATH = ("hooks", "factored")
LIBRARY = str(Path(grab_exp.__file__).parent)
TOLERANCE = 1e-8  #: float64: relative to the largest reference entry
#: under bfloat16 autocast: the loss and ``p.grad`` against a plain step under autocast (the same
#: computation), the rows' mean against ``p.grad`` (bfloat16 kernels' sums against float32 sums
#: of the same output gradients: the check's own loose tolerance), and the rows against the
#: float32 per-example loop without autocast, or the per-example loop under autocast, at
#: :func:`rows_tolerance`
AUTOCAST_TOLERANCE = {"loss": 1e-5, "p.grad": 1e-5, "mean": 5e-2}


def rows_tolerance(autocast_grad: torch.Tensor | None, exact_grad: torch.Tensor | None) -> float:
    """The rows' tolerance under autocast, relative to their scale: 0.25, or 4 times as far as
    the batch step's own ``p.grad`` under autocast is from the float32 one where that is more (a
    row given to another example is off by the order of the scale; bfloat16 rounding of the
    batch's computation by the order of its own gradient's error)."""
    if autocast_grad is None or exact_grad is None:
        return 0.25
    scale = exact_grad.abs().max().clamp_min(1e-30)
    return max(0.25, 4 * ((autocast_grad - exact_grad).abs().max() / scale).item())


@dataclass
class Outcome:
    """What one case did.

    Attributes:
        kind: one of :data:`OUTCOMES`.
        call: the 0-based call it happened at (``-1``: ``make_per_sample``; ``None``: right).
        detail: one line: the message, or what differs and by how much.
    """

    kind: str
    call: int | None = None
    detail: str = ""


def allowed_refusal(case: Case) -> bool:
    """Whether ``case`` may be refused: a by-design feature, or the hook path by name."""
    return case.method in HOOK_PATH or by_design(case)


def by_design(case: Case) -> bool:
    """Whether ``case``'s model or loss breaks the contract by design (:data:`BY_DESIGN`): the
    checks refuse it, and with them off (``check:off``) its results may be wrong."""
    design = set(BY_DESIGN) | (set(BY_DESIGN_FUNC) if case.method == "func" else set())
    design |= set(BY_DESIGN_ALONE) if case.method in ("func", "loop") else set()
    hooks_refuse = case.family == "rnn" or bool(set(BY_DESIGN_HOOKS) & set(case.features))
    if case.method == "auto" and hooks_refuse:
        design |= set(BY_DESIGN_ALONE)  # no method is left for it
    # the momentum encoder made trainable: its forward changes a trainable weight in place
    ema_trained = {"param:ema", "sched:unfreeze"} <= set(case.features)
    # a BatchNorm (drawn in eval mode) switched to training mode: its statistics mix the examples
    trained_norm = "sched:mode" in case.features and bool(
        {"block:batchnorm", "conv_block:batchnorm"} & set(case.features)
    )
    return ema_trained or trained_norm or bool(design & set(case.features))


def classify(error: Exception, case: Case, call: int) -> Outcome:
    """The outcome of an exception raised at ``call``."""
    message = str(error)
    first = message.strip().splitlines()[0] if message.strip() else ""
    if not is_refusal(error) or "\n" in message or not first:
        lines = message.count("\n") + 1
        return Outcome("crash", call, f"{type(error).__name__} ({lines} lines): {first}"[:300])
    kind = "refused" if allowed_refusal(case) else "false_refusal"
    return Outcome(kind, call, f"{type(error).__name__}: {first}"[:300])


#: what grab_exp's own code raises only by mistake (wrapped in a one-line refusal, it is a crash)
BUGS = (IndexError, KeyError, AttributeError, TypeError, NameError, AssertionError)


def is_refusal(error: Exception) -> bool:
    """An ``UnsupportedModelError`` that wraps no :data:`BUGS` raised in grab_exp's own code, or
    a ``ValueError`` raised by grab_exp itself (not torch's own ``ValueError``, a raw message)."""
    if isinstance(error, UnsupportedModelError):
        return not engine_bug(error)
    frames = traceback.extract_tb(error.__traceback__)
    return isinstance(error, ValueError) and bool(frames) and LIBRARY in frames[-1].filename


def engine_bug(error: BaseException) -> bool:
    """Whether ``error``'s causes hold one of :data:`BUGS` raised in a grab_exp file."""
    cause = error.__cause__
    while cause is not None:
        frames = traceback.extract_tb(cause.__traceback__)
        if isinstance(cause, BUGS) and frames and LIBRARY in frames[-1].filename:
            return True
        cause = cause.__cause__
    return False


def difference(
    got: torch.Tensor | None, want: torch.Tensor | None, tolerance: float = TOLERANCE
) -> str | None:
    """Why ``got`` is not ``want`` (``None`` where it is), at ``tolerance`` of the largest
    reference entry."""
    if want is None:
        return None if got is None or not got.any() else "nonzero where autograd gives none"
    if got is None:
        return "none where autograd gives one"
    if got.shape != want.shape:
        return f"shape {tuple(got.shape)} != {tuple(want.shape)}"
    got = got.to(want.dtype)
    if not torch.equal(torch.isfinite(got), torch.isfinite(want)):
        return "non-finite entries differ"
    finite = torch.isfinite(want)
    scale = want[finite].abs().max().item() if finite.any() else 0.0
    err = (got - want)[finite].abs().max().item() if finite.any() else 0.0
    if err > tolerance * scale + 1e-14:
        return f"off by {err:.3g} (scale {scale:.3g})"
    return None


def compare(model, loss, grads, ref: Reference, exact: Reference | None = None) -> str | None:
    """What differs between one call's returns (and ``p.grad``) and the references (``exact``:
    the rows' float32 reference of a call under autocast, see :data:`AUTOCAST_TOLERANCE`)."""
    tol = dict.fromkeys(AUTOCAST_TOLERANCE, TOLERANCE) if exact is None else AUTOCAST_TOLERANCE
    problem = difference(loss.detach().reshape(()), ref.loss.reshape(()), tol["loss"])
    if problem is not None:
        return f"loss {problem}"
    rows = grads.as_dict()
    if list(rows) != list(ref.rows):
        return f"row names {list(rows)} != trainable {list(ref.rows)}"
    for name, want in (exact or ref).rows.items():
        limit = TOLERANCE if exact is None else rows_tolerance(ref.grads[name], exact.grads[name])
        problem = difference(rows[name], want, limit)
        if problem and exact is not None:  # or as each example alone under autocast gets them
            problem = difference(rows[name], ref.rows[name], limit) and problem
        if problem is not None:
            return f"rows of {name} {problem}"
    for name, p in model.named_parameters():
        problem = difference(dense_grad(p), ref.grads[name], tol["p.grad"])
        mean = None if exact is None or name not in rows else rows[name].mean(0)
        limit = None if mean is None else mean_tolerance(ref, name, tol["mean"])
        problem = problem or (mean is not None and difference(mean, dense_grad(p), limit))
        if problem:
            return f"p.grad of {name} {problem}" if mean is None else f"{name}: {problem}"
    return None


def mean_tolerance(ref: Reference, name: str, floor: float) -> float:
    """The rows' mean against ``p.grad`` under autocast: ``floor``, or twice as far as the
    reference's own rows (each example alone under autocast) are from its plain step where that
    is more (seeds 2592, 4479, 5722: loop's rows are those exactly, and their mean is 5.3-5.8 %
    of the scale from the step, whose bfloat16 rounding is up to 7.5 % from float32's)."""
    own, want = ref.rows[name].mean(0), ref.grads[name]
    if want is None:  # the loss does not reach it: its rows are zeros
        return floor
    scale = want.abs().max().clamp_min(1e-30)
    return max(floor, 2 * ((own - want).abs().max() / scale).item())


def state_problem(model, ref_model) -> str | None:
    """What differs in the buffers and frozen parameters after a call from a plain step's."""
    got = state(model)
    for name, want in state(ref_model).items():
        problem = difference(got.get(name), want)
        if problem is not None:
            return f"after the call, {name} {problem}"
    return None


def after_problem(model, ref_model, ref: Reference) -> str | None:
    """What differs after a call from a plain step: the state (:func:`state_problem`), numpy's
    and Python's generators."""
    if (problem := state_problem(model, ref_model)) is not None:
        return problem
    if generators() != ref.generators:
        return "after the call, numpy's or Python's generator is not where a plain step's is"
    return None


def written_on_refusal(model, call: int) -> Outcome | None:
    """``wrong`` where a call that raised left a ``p.grad`` (it was ``None`` before the call):
    a refusal leaves ``p.grad`` as it was."""
    written = [n for n, p in model.named_parameters() if p.grad is not None]
    if not written:
        return None
    return Outcome("wrong", call, f"raised but wrote p.grad of {', '.join(written[:3])}")


def options(case: Case) -> dict:
    extra = {} if case.check_every is None else {"check_every": case.check_every}
    return {"reuse_buffer": case.reuse_buffer, **extra}


def run_case(case: Case) -> Outcome:
    """Run ``case``: one ``psg`` over its batches, each call against its references."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _run(case)


def _run(case: Case) -> Outcome:
    model, loss_fn = case.build()
    ref_model, ref_loss = case.build()
    exact_model, exact_loss = case.build() if case.autocast else (None, None)
    try:
        psg = make_per_sample(model, loss_fn, case.method, **options(case))
    except Exception as error:  # every exception is classified
        return classify(error, case, -1)
    for k, (x, y) in enumerate(case.batches):
        for change in case.changes[k]:
            for changed in (model, ref_model, exact_model):
                if changed is not None:
                    change(changed)
        precision = torch.autocast("cpu", dtype=torch.bfloat16, enabled=case.autocast)
        start = seeded(case.seed * 1009 + k)  # numpy's and Python's draws: the same each forward
        try:
            if k == 0 and "block:scripted" in case.features:
                warm_up(ref_model, ref_loss, x, y, precision)
            with precision:
                ref = reference(ref_model, ref_loss, x, y, start)
            exact = None if exact_model is None else reference(exact_model, exact_loss, x, y, start)
        except Exception as error:  # a fault of the generator, not of the code under test
            return Outcome("invalid", k, f"{type(error).__name__}: {error}".splitlines()[0])
        model.zero_grad(set_to_none=True)
        start()
        try:
            with precision:
                loss, grads = psg(x, y)
        except Exception as error:  # every exception is classified
            return written_on_refusal(model, k) or classify(error, case, k)
        problem = compare(model, loss, grads, ref, exact) or after_problem(model, ref_model, ref)
        if problem is not None:
            unchecked = case.check_every == 0 and by_design(case)  # the user's to keep
            return Outcome("unchecked" if unchecked else "wrong", k, f"B={size(y)}: {problem}")
    return Outcome("right")


def warm_up(model, loss_fn, x, y, precision) -> None:
    """One plain step, then the model's state put back: a ``torch.jit.script`` module's first
    run under autocast computes otherwise than its later ones (torch.jit's profiling executor;
    seed 2055: p.grad 1.5e-4 apart at a scale of 0.027), and every method runs the model before
    its batch step (probes, the examples' forwards), so the reference runs it once first too."""
    saved = buffers(model)
    found = dict(vars(loss_fn)) if hasattr(loss_fn, "__dict__") else {}  # a loss's count
    with precision:
        reference(model, loss_fn, x, y)
    load(model, saved)
    if found:
        vars(loss_fn).update(found)


def shrink(case: Case, outcome: Outcome) -> frozenset[str]:
    """The features of ``case`` that its failing ``outcome`` needs: each turned off in turn,
    kept off while the case still fails the same way."""
    off = set(case.off)
    for feature in case.features:
        if feature.startswith("method:"):
            continue
        trial = draw_case(case.seed, frozenset(off | {feature}))
        if run_case(trial).kind == outcome.kind:
            off.add(feature)
    kept = draw_case(case.seed, frozenset(off)).features
    return frozenset(kept)
