"""The layers the fuzzer composes: blocks that take ``(h, ctx)`` and return the next ``h``.

``h`` is ``(B, D)`` (vector blocks), ``(B, D, H, W)`` / ``(B, D, T)`` (convolution blocks) or
``(B, T, D)`` (token blocks); ``ctx`` holds the batch's ``mask`` (``(B, T)`` bool, ``True`` on
real tokens, or ``None``). Every block is per-example: example ``i`` of the output depends on
example ``i`` of the input only, so a per-example loop is its exact reference.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import parametrize
from torch.utils.checkpoint import checkpoint

D = 8  #: the width of every hidden representation


class OldStyleTanh(torch.autograd.Function):
    """A custom op in the old style (``ctx`` in ``forward``): torch.func cannot transform it."""

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return 1.5 * y

    @staticmethod
    def backward(ctx, g):
        (y,) = ctx.saved_tensors
        return 1.5 * g * (1 - y * y)


class NewStyleCube(torch.autograd.Function):
    """A custom op with ``setup_context`` and a generated vmap rule."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x):
        return x * x.abs() * 0.5 + x

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(inputs[0])

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x.abs() + 1)


class LinearFn(torch.autograd.Function):
    """``x @ w.T`` as a custom op whose input is a parameter (no rule can know it)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w):
        return x @ w.t()

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, (g.reshape(-1, g.shape[-1]).t() @ x.reshape(-1, x.shape[-1]))


class Symmetric(nn.Module):
    """A parametrization: the weight is ``X``'s upper triangle mirrored."""

    def forward(self, x):
        return x.triu() + x.triu(1).transpose(-1, -2)


class ShiftedConv2d(nn.Conv2d):
    """A convolution of its input scaled and shifted: a ``_conv_forward`` of its own (as timm's
    ``Conv2dSame``, which pads its input itself)."""

    def _conv_forward(self, x, weight, bias):
        return super()._conv_forward(1.5 * x + 0.25, weight, bias)


class Wrap(nn.Module):
    """A block around a module that takes ``h`` only, plus an optional activation."""

    def __init__(self, inner: nn.Module, act: str = "none") -> None:
        super().__init__()
        self.inner, self.act = inner, act

    def forward(self, h, ctx):
        h = self.inner(h)
        if self.act == "tanh":
            return torch.tanh(h)
        return h.relu_() if self.act == "relu_" else h


class Residual(nn.Module):
    """``out = lin(h); out += h`` (in place on a fresh tensor)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, h, ctx):
        out = self.lin(h)
        out += h
        return out


class Custom(nn.Module):
    """A custom ``autograd.Function`` of ``kind`` ``old``, ``new`` or ``param`` (with a weight)."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        self.weight = nn.Parameter(torch.zeros(D, D)) if kind == "param" else None

    def forward(self, h, ctx):
        if self.kind == "param":
            return LinearFn.apply(h, self.weight)
        return OldStyleTanh.apply(h) if self.kind == "old" else NewStyleCube.apply(h)


class Checkpointed(nn.Module):
    """A Linear + tanh under activation checkpointing."""

    def __init__(self, reentrant: bool) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(D, D), nn.Tanh())
        self.reentrant = reentrant

    def forward(self, h, ctx):
        return checkpoint(self.inner, h, use_reentrant=self.reentrant)


class Sorted(nn.Module):
    """Sorts the batch by ``h[:, 0]``, applies a Linear, and puts the order back (``unsort``)
    or not (then the outputs are in another order than the targets: the loss breaks)."""

    def __init__(self, unsort: bool) -> None:
        super().__init__()
        self.lin, self.unsort = nn.Linear(D, D), unsort

    def forward(self, h, ctx):
        order = h[:, 0].argsort()
        out = torch.tanh(self.lin(h[order]))
        return out[order.argsort()] if self.unsort else out


class TiedFunctional(nn.Module):
    """``F.linear(h, src.weight)`` or its transpose: a parameter used outside its module."""

    def __init__(self, src: nn.Linear, transpose: bool) -> None:
        super().__init__()
        self._src = [src]  # not registered: the weight belongs to the other module
        self.transpose = transpose

    def forward(self, h, ctx):
        w = self._src[0].weight
        return torch.tanh(F.linear(h, w.t() if self.transpose else w))


class Gated(nn.Module):
    """A Linear that runs only when the batch's Python ``flag`` input is true."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(D, D)

    def forward(self, h, ctx):
        return h + torch.tanh(self.lin(h)) if ctx["flag"] else h


class Attention(nn.Module):
    """Self-attention over ``(B, T, D)``: ``nn.MultiheadAttention`` or a whole
    ``TransformerEncoderLayer``, with the batch's key-padding mask when it has one."""

    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind
        if kind == "mha":
            self.inner = nn.MultiheadAttention(D, 2, batch_first=True)
        else:
            self.inner = nn.TransformerEncoderLayer(D, 2, 2 * D, dropout=0.0, batch_first=True)

    def forward(self, h, ctx):
        kpm = None if ctx["mask"] is None else ~ctx["mask"]
        if self.kind == "mha":
            out, _ = self.inner(h, h, h, key_padding_mask=kpm, need_weights=False)
            return h + out
        return self.inner(h, src_key_padding_mask=kpm)


def plain_linear(draw) -> nn.Module:
    return Wrap(nn.Linear(D, D), draw.pick("act", ["tanh", "relu_"]))


def vector_block(draw, earlier: list[nn.Module]) -> nn.Module:
    """One ``(B, D) -> (B, D)`` block (``earlier``: blocks before it, for ties)."""
    kinds = ["linear", "residual", "layernorm", "groupnorm", "batchnorm", "custom", "scripted"]
    kinds += ["parametrized", "checkpoint", "fwd_hook", "sort", "tied", "share", "gated"]
    kind = draw.pick("block", kinds)
    linears = [
        m for b in earlier for m in b.modules() if type(m) is nn.Linear and m.in_features == D
    ]
    if kind in ("tied", "share") and not linears:
        kind = "linear"
    return _VECTOR[kind](draw, linears)


def _norm(kind: str):
    def make(draw, linears):
        if kind == "layernorm":
            return Wrap(nn.LayerNorm(D))
        if kind == "groupnorm":
            return Wrap(nn.GroupNorm(2, D))
        return Wrap(nn.BatchNorm1d(D).eval())

    return make


def _scripted(draw, linears):
    return Wrap(torch.jit.script(nn.Sequential(nn.Linear(D, D), nn.Tanh())))


def _parametrized(draw, linears):
    lin = nn.Linear(D, D)
    parametrize.register_parametrization(lin, "weight", Symmetric())
    return Wrap(lin, "tanh")


def _fwd_hook(draw, linears):
    lin = nn.Linear(D, D)
    if draw.pick("hook", ["post", "pre"]) == "post":
        lin.register_forward_hook(lambda m, i, o: o * 1.5)
    else:
        lin.register_forward_pre_hook(lambda m, i: (i[0] * 0.5,))
    return Wrap(lin, "tanh")


def _tied(draw, linears):
    src = linears[draw.int(0, len(linears) - 1)]
    return TiedFunctional(src, draw.chance("tied:transpose", 0.5))


_VECTOR = {
    "linear": lambda draw, linears: plain_linear(draw),
    "residual": lambda draw, linears: Residual(),
    "layernorm": _norm("layernorm"),
    "groupnorm": _norm("groupnorm"),
    "batchnorm": _norm("batchnorm"),
    "custom": lambda draw, linears: Custom(draw.pick("fn", ["new", "old", "param"])),
    "scripted": _scripted,
    "parametrized": _parametrized,
    "checkpoint": lambda draw, linears: Checkpointed(draw.chance("ckpt:reentrant", 0.3)),
    "fwd_hook": _fwd_hook,
    "sort": lambda draw, linears: Sorted(not draw.chance("sort:no_unsort", 0.2)),
    "tied": _tied,
    "share": lambda draw, linears: Wrap(linears[-1], "tanh"),
    "gated": lambda draw, linears: Gated(),
}


def conv_block(draw, dims: int) -> nn.Module:
    """One ``(B, D, *spatial) -> same`` block: grouped / dilated convolutions and norms."""
    kind = draw.pick("conv_block", ["conv", "groupnorm", "batchnorm", "conv_relu_"])
    if kind in ("conv", "conv_relu_"):
        groups = int(draw.pick("groups", ["1", "2", "8"]))
        dilation = int(draw.pick("dilation", ["1", "2"]))
        conv = (nn.Conv1d if dims == 1 else nn.Conv2d)(
            D, D, 3, padding="same", groups=groups, dilation=dilation
        )
        return Wrap(conv, "tanh" if kind == "conv" else "relu_")
    if kind == "groupnorm":
        return Wrap(nn.GroupNorm(4, D))
    return Wrap((nn.BatchNorm1d if dims == 1 else nn.BatchNorm2d)(D).eval())


def token_block(draw) -> nn.Module:
    """One ``(B, T, D) -> (B, T, D)`` block: attention, per-token Linear, LayerNorm, custom."""
    kind = draw.pick("tok_block", ["linear", "mha", "encoder_layer", "layernorm", "custom"])
    if kind in ("mha", "encoder_layer"):
        return Attention(kind)
    if kind == "layernorm":
        return Wrap(nn.LayerNorm(D))
    if kind == "custom":
        return Custom(draw.pick("fn", ["new", "old", "param"]))
    return Wrap(nn.Linear(D, D), "tanh")
