"""One generated case: a model, its loss, its batches, the changes between calls and the method
under test, all drawn from one seed (:func:`draw_case`).

The model is built by :meth:`Case.build`, which can be called again for a fresh copy that is
equal in every parameter, tie and hook (the reference's model: a copy made by ``deepcopy`` would
carry the hooks of ``make_per_sample``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from .blocks import ShiftedConv2d
from .draw import Draw
from .inputs import batches, same_shape, sorted_on_checks
from .losses import CLASS_LOSSES, TOKEN_LOSSES, class_loss, token_loss, with_extras
from .models import (
    CLASSES,
    FAMILIES,
    VOCAB,
    BufferedReplay,
    ChildOutput,
    ConvStem,
    DrawnDropout,
    MaskDropout,
    NarrowConv,
    SwappedCall,
    VmappedCall,
    add_state,
    build_net,
    reinit,
)
from .schedule import Change, change, mix_on, param_hook, schedule, tie_after

METHODS = ["auto", "func", "hooks", "factored", "loop"]
#: how often each is drawn: ``auto`` (the default) most, ``loop`` (the last resort, slow) least
METHOD_WEIGHTS = [0.5, 0.15, 0.15, 0.15, 0.05]
#: calls of a case of one shape (``batch:same_shape``)
STEPS = 7
#: the class losses' weights: the right ones more often than those refused by design
CLASS_LOSS_WEIGHTS = [4, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1]


@dataclass
class Case:
    """A generated case (see the module docstring).

    Attributes:
        seed, off, only: what it was drawn from (:func:`draw_case`).
        family: the model's family (:mod:`fuzz.models`).
        features: every feature it has, model, loss, inputs and schedule.
        method, check_every, reuse_buffer: ``make_per_sample``'s arguments (``check_every``
            ``None``: the default).
        batches: ``(x, y)`` per call.
        changes: the changes before each call (call 0's come after ``make_per_sample``).
        build: a fresh ``(model, loss_fn)``.
        autocast: every call (and its references) under ``torch.autocast("cpu", bfloat16)``,
            the model in float32.
    """

    seed: int
    off: frozenset[str]
    only: frozenset[str] | None
    family: str
    features: tuple[str, ...]
    method: str
    check_every: int | None
    reuse_buffer: bool
    batches: list[tuple[Any, Any]]
    changes: list[list[Change]]
    build: Callable[[], tuple[nn.Module, Callable]]
    autocast: bool = False


def draw_case(
    seed: int, off: frozenset[str] = frozenset(), only: frozenset[str] | None = None
) -> Case:
    """The case of ``seed`` with the features in ``off`` turned off, or with the features in
    ``only`` on and every other off (``family:<name>`` in it picks the family)."""
    draw = Draw(seed, off, only)
    family = draw.rng.choice(FAMILIES)
    family = next((f[7:] for f in only or () if f.startswith("family:")), family)
    method = draw.pick("method", METHODS, METHOD_WEIGHTS)
    check_every = 1 if draw.chance("check:every_call", 0.15) else None
    reuse_buffer = draw.chance("reuse_buffer", 0.3)
    if family == "lm":
        loss = draw.pick("loss", TOKEN_LOSSES)
    else:
        loss = draw.pick("loss", CLASS_LOSSES, CLASS_LOSS_WEIGHTS)
    model_seed = draw.rng.getrandbits(62)
    calls = draw.int(2, 5)
    data = batches(draw, family, loss, calls)
    changes = schedule(draw, calls, family == "lm")
    # drawn last, so that every other choice of a seed is what it was before this feature
    # precision:autocast: a float32 model and inputs, every call under torch.autocast(bfloat16)
    autocast = draw.chance("precision:autocast", 0.1)
    if draw.chance("sched:mix_on", 0.05):  # drawn last too: mixup switched on by the loop on
        changes[draw.int(1, calls - 1)].append(mix_on)  # one kind of batch (calls 3 and 5 are
        data = [data[0]] * calls  # not the check's: 1, 2, 4, ...)
    sort_neck = family != "lm" and draw.chance("sched:sorted_checks", 0.05)  # drawn last too
    if sort_neck:  # the neck reorders its batch by data: in order on the check's calls only
        data = sorted_on_checks(*data[0], calls)
        ways = ["stack", "matrix", "roll", "einsum", "matrix_right", "embedding"]
        sort_neck = draw.pick("sort:how", ways)
    coupled = draw.chance("bwd:coupled", 0.03)  # drawn last too: a backward scaled by B
    own_conv = _layer_changes(draw, family, changes)  # drawn last too
    _one_token(draw, family, data)  # drawn last too
    check_every = _checks_off(draw, check_every)  # drawn last too
    data = _steps(draw, family, loss, data, changes)  # drawn last too
    _late_changes(draw, changes)  # drawn last too
    if autocast:  # float32 inputs
        data = [(tree_map(_single, x), tree_map(_single, y)) for x, y in data]

    def build() -> tuple[nn.Module, Callable, list[str]]:
        d = Draw(model_seed, off, only)
        net = build_net(d, family, VOCAB if family == "lm" else CLASSES)
        net = net.float() if autocast else net.double()
        reinit(net, d.generator())
        if d.chance("tie:before", 0.1):
            tie_after(net, d.generator())
        if d.chance("hook:param_before", 0.08):
            param_hook(net, d.generator())
        add_state(net, family, d)  # drawn last: a seed's other choices are what they were
        if family in ("tok", "lm", "rnn") and d.chance("emb:wide", 0.3):  # drawn after it
            widen(net.stem.emb, d.generator())
        net.sort_neck, net.coupled = sort_neck, coupled
        _model_drawn_last(d, net, autocast)
        if own_conv:
            net.stem.conv.__class__ = ShiftedConv2d
        base = token_loss(loss) if family == "lm" else class_loss(loss)
        loss_fn = with_extras(base, net, net.aux, net.store)
        _reads_calls(d, loss_fn if loss_fn is base and loss == "stateful" else None)
        return net, loss_fn, d.features

    model_features = build()[2]
    features = (*draw.features, *model_features)
    return Case(
        seed, off, only, family, features, method, check_every, reuse_buffer, data, changes,
        lambda: build()[:2], autocast,
    )  # fmt: skip


def _reads_calls(d: Draw, stateful) -> None:
    """``loss:reads_calls`` (drawn last): the ``stateful`` loss scaled by the count of its calls;
    not through a closure (:func:`~fuzz.losses.with_extras`), whose state is not seen."""
    if stateful is not None and d.chance("loss:reads_calls", 0.5):
        stateful.reads = True


def _steps(draw: Draw, family: str, loss: str, data: list, changes: list[list[Change]]) -> list:
    """``batch:same_shape``: 7 calls of one shape (the checks' calls 1, 2 and 4; the others only
    split the loss and compare the rows' mean), where no other feature fixes the batches."""
    fixed = {"seq:one", "sched:mix_on", "sched:sorted_checks"} & set(draw.features)
    if fixed or not draw.chance("batch:same_shape", 0.4):
        return data
    changes += [[] for _ in range(STEPS - len(changes))]
    return same_shape(draw, family, loss, data, STEPS)


def _late_changes(draw: Draw, changes: list[list[Change]]) -> None:
    """``sched:del_block``: a block of the neck deleted before a call after the first; then
    ``sched:copy_after``: a frozen deep copy of the model, made before a call (after
    ``make_per_sample``), whose head the forward adds (``Net.copied``)."""
    if draw.chance("sched:del_block", 0.06):
        changes[draw.int(1, len(changes) - 1)].append(change("del_block", draw.rng.getrandbits(30)))
    if draw.chance("sched:copy_after", 0.05):
        changes[draw.int(0, len(changes) - 1)].append(change("copy_after", 0))


def _checks_off(draw: Draw, check_every: int | None) -> int | None:
    """``check:off``: ``check_every=0`` where the checks' period is the default."""
    return 0 if check_every is None and draw.chance("check:off", 0.1) else check_every


def _model_drawn_last(d: Draw, net: nn.Module, autocast: bool) -> None:
    """The model's features drawn after all others (a seed's other choices stay what they were):
    ``replay:buffers`` (a neck block replayed per example whose forward changes its buffers),
    ``pos:over`` (a statistic over the positions), ``drop:masked`` (a dropout after the stem,
    not under autocast, whose rounding would change its masks), ``neck:child_output`` and
    ``neck:swapped`` (:class:`ChildOutput`, :class:`SwappedCall`) and ``head:zero`` (a head at
    zero: the examples' losses alike, where only gradients tell a weighting from a mean), then
    ``attr:log`` and ``attr:tensor_count`` (state changed in place: a list of features and a
    tensor attribute, each a count the forward reads), then ``attr:lazy_count`` (a count the first
    forward creates, ``if not hasattr(self, "n")``)."""
    if d.chance("replay:buffers", 0.06):
        kind = d.pick("replay", ["counter", "spectral_norm"])
        net.neck.append(BufferedReplay(kind, d.generator(), net.head.weight.dtype))
    if getattr(net.stem, "pos_use", None) in ("call", "keyword") and d.chance("pos:over", 0.3):
        net.stem.pos_over = d.pick("over", ["normed", "max"])
    if not autocast and d.chance("drop:masked", 0.15):
        net.drop = MaskDropout(0.3)
    dtype = net.head.weight.dtype
    if d.chance("neck:child_output", 0.08):
        net.neck.append(ChildOutput(d.generator(), dtype))
    if d.chance("neck:swapped", 0.04):
        net.neck.append(SwappedCall(d.generator(), dtype))
    if d.chance("head:zero", 0.05):  # every example's loss alike, as at the start of training
        for p in net.head.parameters():
            nn.init.zeros_(p)
    _drawn_after(d, net, dtype)
    _drawn_latest(d, net, dtype, autocast)


def _drawn_latest(d: Draw, net: nn.Module, dtype: torch.dtype, autocast: bool) -> None:
    """The features added last (a seed's earlier choices stay what they were): ``drop:drawn``
    (:class:`DrawnDropout`; not under autocast, as ``drop:masked``), then ``neck:vmapped``
    (:class:`VmappedCall`)."""
    if not autocast and d.chance("drop:drawn", 0.08):
        net.drawn = DrawnDropout(d.pick("drawn", ["numpy", "python"]))
    if d.chance("neck:vmapped", 0.04):
        net.neck.append(VmappedCall(d.generator(), dtype))


def _drawn_after(d: Draw, net: nn.Module, dtype: torch.dtype) -> None:
    """:func:`_model_drawn_last`'s last features, in their order."""
    if d.chance("attr:log", 0.05):
        net.log = []
    if d.chance("attr:tensor_count", 0.05):
        net.count = torch.zeros((), dtype=dtype)
    net.lazy_count = d.chance("attr:lazy_count", 0.05)
    image = isinstance(net.stem, ConvStem) and isinstance(net.stem.conv, nn.Conv2d)
    if image and d.chance("conv:narrow", 0.3):  # drawn last too: a narrow convolution after a layer
        net.body.append(NarrowConv(d.pick("narrow:pre", NARROW_PRE), d.generator(), dtype))


def _layer_changes(draw: Draw, family: str, changes: list[list[Change]]) -> bool:
    """Whether the image stem's narrow convolution has a ``_conv_forward`` of its own; its
    ``padding_mode``, the head's weight registered again after its bias, or the head's bias set
    to ``None``, changed before a call after the first (in ``changes``)."""
    own_conv = family == "img" and draw.chance("conv:own_forward", 0.1)
    for kind in ("padding_mode", "reregister", "bias_none"):
        if (family == "img" or kind != "padding_mode") and draw.chance(f"sched:{kind}", 0.05):
            changes[draw.int(1, len(changes) - 1)].append(change(kind, 0))
    return own_conv


#: what ``conv:narrow`` puts before its narrow convolution
NARROW_PRE = ["instance_norm", "flat_grad", "tanh"]

#: ``emb:wide``'s vocabulary: an embedding with more rows than the ids use, ``T² <= V`` for
#: every length drawn (3-7), so that the factored path keeps its rows compact (``EmbeddingRows``)
WIDE = 64


def widen(emb: nn.Embedding, g: torch.Generator) -> None:
    """Rows up to :data:`WIDE` appended to ``emb`` (no id reaches them: their rows stay 0)."""
    extra = torch.randn(WIDE - emb.num_embeddings, emb.embedding_dim, generator=g)
    weight = torch.cat([emb.weight.detach(), extra.to(emb.weight.dtype)])
    emb.weight, emb.num_embeddings = nn.Parameter(weight), WIDE


def _one_token(draw: Draw, family: str, data: list[tuple[Any, Any]]) -> None:
    """``seq:one``: a token family's call after the first gets its sequences cut to their first
    token (``T = 1``, where a position embedding's ``(T, D)`` broadcasts over ``(B, T, D)``)."""
    if family in ("tok", "lm", "rnn") and draw.chance("seq:one", 0.15):
        k = draw.int(1, len(data) - 1)
        data[k] = tree_map(_first_token, data[k])


def _first_token(value: Any) -> Any:
    """A ``(B, T, ...)`` tensor of ids or a mask (integer or bool) as ``(B, 1, ...)``."""
    cut = isinstance(value, torch.Tensor) and value.dim() >= 2 and not value.is_floating_point()
    return value[:, :1] if cut else value


def _single(value: Any) -> Any:
    """A float64 tensor as float32 (anything else as it is)."""
    is_double = isinstance(value, torch.Tensor) and value.dtype == torch.float64
    return value.float() if is_double else value
