"""The fuzzer's models: a stem for the input's kind, blocks, a pooling, a head (:class:`Net`).

Families (``family:...`` features): ``vec`` (``(B, 5)`` floats), ``img`` (``(B, 3, 6, 6)``),
``seq`` (``(B, 3, T)`` for 1-d convolutions), ``tok`` (``(B, T)`` token ids padded with
:data:`PAD`, embeddings and attention) and ``rnn`` (token ids through ``pack_padded_sequence``
and an RNN, LSTM or GRU). ``lm`` is ``tok`` with a per-token head (``(B, T, V)`` outputs).
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence

from .blocks import D, conv_block, token_block, vector_block

IN, CLASSES, VOCAB, PAD = 5, 4, 12, 0

FAMILIES = ["vec", "img", "seq", "tok", "rnn", "lm"]


class Net(nn.Module):
    """``stem -> body -> pool -> neck -> head``; ``forward(x, mask=None, scale=1.0, flag=True)``
    takes the Python values of dict and tuple inputs.

    Args:
        aux: return ``{"logits": out, "aux": (h**2).mean()}`` (a batch-mean scalar beside the
            output, as a VAE's KL term).
        store: keep the pooled activation on ``self.last`` (a loss may read it).
        whole: the aux term is ``(h.mean(0)**2).mean()`` instead, a value of the whole batch
            that is no mean of per-example terms (a load-balancing term): refused by design.
        mix: mix each example with its mirror, ``0.7 h + 0.3 h.flip(0)`` (batch-flip mixup).
        counter: a buffer the forward advances and reads (a step counter).
        swap: for ``B >= 6`` swap the inputs of examples 3 and 4 (no gradient crosses them).
        running: subtract a batch mean kept in a buffer, in the same forward (training mode).
        step: a schedule kept in a plain ``int`` attribute, advanced in training mode.

    Set after construction: ``log`` (a list the training forward appends its features to) and
    ``count`` (a tensor attribute, not a buffer, that it advances in place), each read as a scale;
    ``lazy_count``: a count that the first training forward creates (``lazy_n``), read alike.
    """

    def __init__(self, stem, body, pool, neck, head, aux=False, store=False, **extra) -> None:
        super().__init__()
        self.stem, self.pool, self.head = stem, pool, head
        self.body, self.neck = nn.ModuleList(body), nn.ModuleList(neck)
        self.aux, self.store = aux, store
        self.whole, self.mix = extra.get("whole", False), extra.get("mix", False)
        self.swap, self.step = extra.get("swap", False), 0 if extra.get("step") else None
        self.lazy_count = False
        if extra.get("running", False):
            self.register_buffer("running", torch.zeros(D, dtype=torch.float64))
        if extra.get("counter", False):
            self.register_buffer("steps", torch.zeros((), dtype=torch.float64))

    def forward(self, x, mask=None, scale=1.0, flag=True):
        ctx = {"mask": mask, "flag": flag}
        self._captured = []  # what this forward's capture hooks see (attr:setup_once)
        h = self.state_effects(self.stem(x, ctx) * scale)
        h = self.dropped(h)
        if getattr(self, "coupled", False):  # the identity, its backward scaled by the batch size
            h = ScaledByBatchSize.apply(h)
        for block in self.body:
            h = block(h, ctx)
        h = self.pool(h, ctx)
        if getattr(self, "setup_once", False):
            h = h * self.pool_calls()
        h = self.in_order(h, x)
        for block in self.neck:
            h = block(h, ctx)
        h = self.in_order(h, x, back=True)
        h = self.buffer_effects(h)
        if self.store:
            self.last = h
        out = self.head(h)
        if hasattr(self, "ema"):
            out = out + 0.1 * self.momentum(h)
        if copied := getattr(self, "copied", None):  # sched:copy_after's frozen copy's head
            extra = copied[0].head(h)
            out = out + 0.1 * extra if extra.shape == out.shape else out
        if not self.aux:
            return out
        return {"logits": out, "aux": (h.mean(0) ** 2).mean() if self.whole else (h**2).mean()}

    def dropped(self, h):
        """``h`` after the dropouts that are on (``drop:masked``, then ``drop:drawn``)."""
        for name in ("drop", "drawn"):
            if hasattr(self, name):
                h = getattr(self, name)(h)
        return h

    def in_order(self, h, x, back=False):
        """``sort_neck``: the examples in the order of ``x``'s first entry (``back``: that order
        undone), with no node that re-indexes: ``h[i]`` each and ``stack`` in Python, a
        permutation ``matrix`` (on the left, on the right, in an ``einsum``), ``F.embedding`` of
        ``h``'s rows or a ``roll`` that starts at the smallest entry."""
        how, key = getattr(self, "sort_neck", False), x.flatten(1)[:, 0]
        if not how:
            return h
        if how == "roll":
            start = int(key.argmin())
            return torch.roll(h, start if back else -start, 0)
        order = key.argsort()
        permutation = torch.eye(len(h), dtype=h.dtype)[order]  # (B, B): P @ h is h[order]
        if how == "matrix":
            return (permutation.T if back else permutation) @ h
        if how == "einsum":  # the matrix contracted with the batch axis (a bmm)
            return torch.einsum("ji,jc->ic" if back else "ij,jc->ic", permutation, h)
        if how == "matrix_right":  # (h.T @ P.T).T is P @ h
            return (h.T @ (permutation if back else permutation.T)).T
        if how == "embedding":  # h's rows taken by index
            return F.embedding(order.argsort() if back else order, h)
        return torch.stack([h[i] for i in (order.argsort() if back else order).tolist()])

    def buffer_effects(self, h):
        """The features after the running mean and the center that are on."""
        if hasattr(self, "running"):
            if self.training:
                self.running = 0.9 * self.running + 0.1 * h.detach().mean(0)
            h = h - self.running
        if hasattr(self, "center"):  # read, then moved in place: no example sees another's
            h = h - self.center
            if self.training:
                self.center.mul_(0.9).add_(0.1 * h.detach().mean(0))
        return h

    def pool_calls(self) -> int:
        """How many capture hooks saw the pool run in this forward: 1, unless a first run's
        setup (a forward hook on the pool, then a flag, as HF's hidden-state capture) ran twice."""
        if not getattr(self, "_capture_installed", False):
            self.pool.register_forward_hook(lambda module, args, out: self._captured.append(1))
            self._capture_installed = True
            return 1  # this forward's pool ran before the hook was on it
        return len(self._captured)

    def momentum(self, h):
        """The frozen copy of the head, moved halfway to it first in training mode (as MoCo's
        key encoder; a head replaced by another shape is not followed)."""
        pairs = list(zip(self.ema.parameters(), self.head.parameters(), strict=False))
        if self.training and all(e.shape == p.shape for e, p in pairs):
            with torch.no_grad():
                for e, p in pairs:
                    e.mul_(0.5).add_(0.5 * p)
        return self.ema(h)

    def attribute_counts(self, h):
        """``h`` scaled by the counts kept in attributes that are on (a log's length, a tensor
        count, a count the first training forward creates), each advanced in training mode."""
        if hasattr(self, "log"):
            if self.training:
                self.log.append(h.detach())
            h = h * (1 + 0.01 * len(self.log))
        if hasattr(self, "count"):
            if self.training:
                self.count += 1
            h = h * (1 + 0.01 * self.count)
        if self.lazy_count:  # made by the first training forward (if not hasattr: ...)
            if self.training and not hasattr(self, "lazy_n"):
                self.lazy_n = 0
            self.lazy_n = getattr(self, "lazy_n", 0) + (1 if self.training else 0)
            h = h * (1 + 0.01 * self.lazy_n)
        return h

    def state_effects(self, h):
        """The stem's output after the swap, the counters and the mixup that are on."""
        if self.swap and len(h) >= 6:
            h = h[[0, 1, 2, 4, 3, *range(5, len(h))]]
        if self.step is not None:
            self.step += 1 if self.training else 0
            h = h * (1 + 0.01 * self.step)
        h = self.attribute_counts(h)
        if self.mix:
            h = 0.7 * h + 0.3 * h.flip(0)
        if hasattr(self, "steps"):
            self.steps += 1
            h = h * (1 + 0.01 * self.steps)
        return h


class ScaledByBatchSize(torch.autograd.Function):
    """``bwd:coupled``: the identity, whose backward multiplies by the batch size (each example's
    gradient then depends on how many it was batched with: refused on every method)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(h):
        return h.view_as(h)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.batch = inputs[0].shape[0]

    @staticmethod
    def backward(ctx, grad):
        return grad * ctx.batch


class VecStem(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(IN, D)

    def forward(self, x, ctx):
        return torch.tanh(self.lin(x))


class ConvStem(nn.Module):
    def __init__(self, dims: int) -> None:
        super().__init__()
        self.conv = (nn.Conv1d if dims == 1 else nn.Conv2d)(3, D, 3, padding=1)

    def forward(self, x, ctx):
        return torch.tanh(self.conv(x))


class TokenStem(nn.Module):
    """Embeddings of ``(B, T)`` ids, a position embedding used as ``pos``, and the mask:
    ``internal`` (``x != PAD``), ``input`` (the batch's, ``None`` on some calls) or ``none``."""

    def __init__(self, draw) -> None:
        super().__init__()
        self.emb = nn.Embedding(
            VOCAB,
            D,
            padding_idx=PAD if draw.chance("emb:padding_idx", 0.4) else None,
            max_norm=1.0 if draw.chance("emb:max_norm", 0.15) else None,
            sparse=draw.chance("emb:sparse", 0.15),
            scale_grad_by_freq=draw.chance("emb:scale_grad_by_freq", 0.05),
        )
        self.pos_use = draw.pick("pos", ["none", "call", "keyword", "weight"])
        self.pos = nn.Embedding(16, D) if self.pos_use != "none" else None
        self.mask_from = draw.pick("mask", ["internal", "input", "none"])

    def forward(self, x, ctx):
        t = x.shape[1]
        if self.mask_from == "internal":
            ctx["mask"] = x != PAD
        elif self.mask_from == "none":
            ctx["mask"] = None
        ctx["lengths"] = (x != PAD).sum(1)
        h = self.emb(x)
        if self.pos_use == "call":
            h = h + self.over(self.pos(torch.arange(t)))[None]
        elif self.pos_use == "keyword":
            h = h + self.over(self.pos(input=torch.arange(t)))
        elif self.pos_use == "weight":
            h = h + self.pos.weight[:t][None]
        return h

    def over(self, p: torch.Tensor) -> torch.Tensor:
        """``pos:over``: the positions ``(T, D)`` after a statistic over them, ``normed`` (by
        their detached norm) or ``max`` (plus their largest entries): a value over the copies
        where the hook path gives them the batch."""
        kind = getattr(self, "pos_over", None)
        if kind == "normed":
            return p / p.detach().norm()
        return p + p.amax(0) if kind == "max" else p


class RnnStem(nn.Module):
    """Embeddings, ``pack_padded_sequence`` (lengths from the padding) and an RNN, LSTM or GRU;
    the last layer's final hidden state ``(B, D)``."""

    def __init__(self, draw) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        kind = draw.pick("rnn", ["LSTM", "GRU", "RNN"])
        layers = 2 if draw.chance("rnn:two_layers", 0.3) else 1
        self.rnn = getattr(nn, kind)(D, D, num_layers=layers, batch_first=True)

    def forward(self, x, ctx):
        lengths = (x != PAD).sum(1)
        packed = pack_padded_sequence(self.emb(x), lengths, batch_first=True, enforce_sorted=False)
        _, hidden = self.rnn(packed)
        hidden = hidden[0] if isinstance(hidden, tuple) else hidden
        return hidden[-1]


class Pool(nn.Module):
    """``(B, T, D)`` or ``(B, D, *spatial)`` to ``(B, D)``: ``mean`` (masked when the batch has
    a mask), ``last`` (the last real token, by index), ``sel`` (the same by ``h[sel]``),
    ``first``, ``spatial`` (mean over the spatial dimensions) or ``none``."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, h, ctx):
        if self.kind == "none":
            return h
        if self.kind == "spatial":
            return h.flatten(2).mean(2)
        if self.kind == "first":
            return h[:, 0]
        if self.kind == "mean":
            if ctx["mask"] is None:
                return h.mean(1)
            m = ctx["mask"].to(h.dtype)[..., None]
            return (h * m).sum(1) / m.sum(1)
        last = ctx["lengths"] - 1
        if self.kind == "last":
            return h[torch.arange(h.shape[0]), last]
        sel = torch.zeros(h.shape[:2], dtype=torch.bool)
        sel[torch.arange(h.shape[0]), last] = True
        return h[sel]


def build_net(draw, family: str, outputs: int) -> Net:
    """A :class:`Net` of ``family`` with ``outputs`` logits (per token for ``lm``)."""
    body: list[nn.Module] = []
    if family in ("tok", "lm"):
        stem, pool = TokenStem(draw), Pool("none" if family == "lm" else "tok")
        body = [token_block(draw) for _ in range(draw.int(0, 2))]
        if family == "tok":
            pool = Pool(draw.pick("pool", ["mean", "last", "sel", "first"]))
    elif family in ("img", "seq"):
        dims = 2 if family == "img" else 1
        stem, pool = ConvStem(dims), Pool("spatial")
        body = [conv_block(draw, dims) for _ in range(draw.int(0, 2))]
    else:
        stem, pool = (VecStem() if family == "vec" else RnnStem(draw)), Pool("none")
    neck: list[nn.Module] = []
    if family != "lm":
        for _ in range(draw.int(0, 3 if family == "vec" else 2)):
            neck.append(vector_block(draw, [stem, *neck]))
    aux, store = draw.chance("out:aux", 0.1), draw.chance("out:stored", 0.1)
    extra = {
        "whole": aux and draw.chance("out:whole", 0.4),
        "mix": draw.chance("mix:flip", 0.04),
        "counter": draw.chance("buf:counter", 0.06),
        "swap": draw.chance("mix:swap_inputs", 0.04),
        "running": family in ("vec", "img", "seq", "rnn") and draw.chance("buf:running_mean", 0.04),
        "step": draw.chance("attr:step", 0.06),
    }
    return Net(stem, body, pool, neck, nn.Linear(D, outputs), aux=aux, store=store, **extra)


def add_state(net: Net, family: str, draw) -> None:
    """``attr:setup_once``: a first forward that hooks the pool and sets a flag (as HF's
    hidden-state capture), the hook's count scaling the features; ``param:ema``: a frozen copy of
    the head, moved toward it by every training forward, a tenth of its output added (a momentum
    encoder updated in ``forward``, as MoCo's); ``buf:read_then_update``: a buffer subtracted
    from the features and then moved in place toward their batch mean (each example alone must
    see the value the call found)."""
    g, dtype = draw.generator(), net.head.weight.dtype
    net.setup_once = draw.chance("attr:setup_once", 0.05)
    if draw.chance("param:ema", 0.05):
        net.ema = copy.deepcopy(net.head).requires_grad_(False)
        with torch.no_grad():
            for p in net.ema.parameters():
                p.add_(0.3 * torch.randn(p.shape, generator=g, dtype=dtype))
    if family in ("vec", "img", "seq", "rnn") and draw.chance("buf:read_then_update", 0.05):
        net.register_buffer("center", 0.1 * torch.randn(D, generator=g, dtype=dtype))


class BufferedReplay(nn.Module):
    """``replay:<kind>``: a neck block around a layer without a rule (replayed per example on the
    hook path) whose forward changes its buffers in place: a ``counter`` of its calls scaling its
    output, or the older ``torch.nn.utils.spectral_norm``'s power iteration (training mode)."""

    def __init__(self, kind: str, g: torch.Generator, dtype: torch.dtype) -> None:
        super().__init__()
        self.kind = kind
        if kind == "spectral_norm":
            self.inner = nn.utils.spectral_norm(nn.Linear(D, D, dtype=dtype))
        else:
            self.inner = CountedLinear(dtype)
        with torch.no_grad():  # drawn from the case's generator, buffers too (u and v: unit)
            for t in (*self.inner.parameters(), *self.inner.buffers()):
                if t.is_floating_point() and t.dim():
                    t.copy_(torch.randn(t.shape, generator=g, dtype=t.dtype))
                    t.div_(t.norm() if t.dim() == 1 else 1.0)

    def forward(self, h, ctx):
        return torch.tanh(self.inner(h))


class NarrowConv(nn.Module):
    """``conv:narrow``: a body block whose second convolution has 4 input channels (the hook
    path's weight copies, CPU layers under 8), after ``pre``: ``instance_norm`` (straight in:
    its backward reads the convolution's input gradient), ``flat_grad`` (a ``tanh`` whose
    backward reads that gradient as ``grad.view(-1)``) or ``tanh``."""

    def __init__(self, pre: str, g: torch.Generator, dtype: torch.dtype) -> None:
        super().__init__()
        self.down = drawn(nn.Conv2d(D, 4, 1, dtype=dtype), g)
        self.norm = (
            nn.InstanceNorm2d(4, affine=True, dtype=dtype) if pre == "instance_norm" else None
        )
        self.up = drawn(nn.Conv2d(4, D, 3, padding=1, dtype=dtype), g)
        self.pre = pre

    def forward(self, h, ctx):
        h = self.down(h)
        if self.norm is not None:
            h = self.norm(h)
        else:
            h = FlatTanh.apply(h) if self.pre == "flat_grad" else torch.tanh(h)
        return torch.tanh(self.up(h))


class FlatTanh(torch.autograd.Function):
    """``tanh``, whose backward reads the incoming gradient as a flat view (``grad.view(-1)``)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return torch.tanh(x)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        return (grad.view(-1) * (1 - out.square()).view(-1)).view(out.shape)


class ChildOutput(nn.Module):
    """``neck:child_output``: a block with a parameter of its own (replayed per example on the
    hook path) that returns its child Linear's output as it is (torchvision's ViT does so)."""

    def __init__(self, g: torch.Generator, dtype: torch.dtype) -> None:
        super().__init__()
        self.scale = nn.Parameter(1 + 0.3 * torch.randn(D, generator=g, dtype=dtype))
        self.inner = drawn(nn.Linear(D, D, dtype=dtype), g)

    def forward(self, h, ctx):
        return self.inner(torch.tanh(h * self.scale))


class SwappedCall(nn.Module):
    """``neck:swapped``: its Linear called through ``torch.func.functional_call`` with the
    weight doubled (the call reads another tensor than the parameter)."""

    def __init__(self, g: torch.Generator, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = drawn(nn.Linear(D, D, dtype=dtype), g)

    def forward(self, h, ctx):
        swap = {"weight": self.inner.weight * 2}
        return torch.tanh(torch.func.functional_call(self.inner, swap, (h,)))


class VmappedCall(nn.Module):
    """``neck:vmapped``: its Linear called inside the model's own ``torch.vmap`` over the batch
    (a per-example function of the user's), where the hook path's hooks see a batched tensor."""

    def __init__(self, g: torch.Generator, dtype: torch.dtype) -> None:
        super().__init__()
        self.inner = drawn(nn.Linear(D, D, dtype=dtype), g)

    def forward(self, h, ctx):
        return torch.tanh(torch.vmap(self.inner)(h))


def drawn(layer: nn.Module, g: torch.Generator) -> nn.Module:
    """``layer`` with its parameters drawn from ``g`` (a model built again is the same)."""
    with torch.no_grad():
        for p in layer.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
    return layer


class MaskDropout(nn.Dropout):
    """``drop:masked``: a Dropout (training mode) whose mask is a function of its input's values,
    elementwise, so that the batch and each example alone get the same masks (the references need
    no record of them); every path takes it for a module that draws random numbers."""

    def forward(self, h):
        if not self.training:
            return h
        keep = torch.frac(h.detach() * 997.0).abs() >= self.p
        return h * keep / (1 - self.p)


class DrawnDropout(nn.Module):
    """``drop:drawn``: a dropout (training mode) whose masks are its input's values shifted by a
    number drawn from numpy's global generator, as HuggingFace wav2vec2's SpecAugment draws its
    masks, or (``drawn:python``) from Python's ``random``, as a LayerDrop coin; no ``nn.Dropout``.
    A forward alone gets an example's masks in the batch where it starts from the batch's
    generator state, as each of the references' forwards does (:func:`fuzz.oracle.seeded`)."""

    def __init__(self, source: str) -> None:
        super().__init__()
        self.source = source

    def forward(self, h):
        if not self.training:
            return h
        shift = np.random.rand() if self.source == "numpy" else random.random()
        keep = torch.frac(h.detach() * 997.0 + shift).abs() >= 0.3
        return h * keep / 0.7


class CountedLinear(nn.Module):
    """A layer without a rule whose output scales with a count of its calls kept in a buffer."""

    def __init__(self, dtype: torch.dtype) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(D, D, dtype=dtype))
        self.register_buffer("calls", torch.zeros((), dtype=dtype))

    def forward(self, h):
        self.calls += 1
        return (h @ self.weight) * (1 + 0.1 * self.calls)


def reinit(model: nn.Module, g: torch.Generator) -> None:
    """Every parameter and running statistic drawn from ``g`` (the padding row kept at 0)."""
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=g, dtype=p.dtype))
        for name, b in model.named_buffers():
            if name.endswith("running_var"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g, dtype=b.dtype))
            elif name.endswith("running_mean"):
                b.copy_(0.1 * torch.randn(b.shape, generator=g, dtype=b.dtype))
        for m in model.modules():
            if isinstance(m, nn.Embedding) and m.padding_idx is not None:
                m.weight[m.padding_idx].zero_()
