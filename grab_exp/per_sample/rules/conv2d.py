"""``nn.Conv2d`` (``groups=1``, zero padding): per-sample grads as one grouped convolution's
weight gradient (narrow layers) or one batched matmul over the patches (wide layers)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from grab_exp.per_sample.rules.base import LayerRule, Outs, register_rule

#: On the CPU, layers with fewer input channels than this run the grouped weight gradient in
#: channels-last layout: faster at LeNet's 3 and 6 input channels (oneDNN, B = 16), slower from 8
#: channels on, as measured in ``results/bench/conv.json``.
CHANNELS_LAST_BELOW = 8


def explicit_padding(layer: nn.Conv2d) -> tuple[int, ...] | None:
    """The layer's zero padding per side as numbers (``"valid"``, and ``"same"`` where it pads
    both sides alike); ``None`` for an asymmetric ``"same"``."""
    if layer.padding == "valid":
        return (0,) * len(layer.kernel_size)
    if layer.padding != "same":
        return tuple(layer.padding)
    totals = [d * (k - 1) for d, k in zip(layer.dilation, layer.kernel_size, strict=True)]
    return None if any(t % 2 for t in totals) else tuple(t // 2 for t in totals)


def conv2d_grads(
    layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, out: Outs = (None, None), copies=None
) -> list[torch.Tensor]:
    """Per-sample ``[weight, bias]`` grads from input ``a (B, C, H, W)``, ``g (B, O, H', W')``:
    ``copies`` (:func:`copy_weight`'s gradient) where given, :func:`grouped_weight_grads` where
    the output positions ``L = H'W'`` outnumber the channels ``O`` (LeNet), else
    :func:`unfold_weight_grads` (patches no larger than the result)."""
    if copies is not None and copies.shape[0] == g.shape[0] * g.shape[1]:  # of the mean loss
        weight = g.new_empty(g.shape[0], *layer.weight.shape) if out[0] is None else out[0]
        weight = torch.mul(copies.view(weight.shape), g.shape[0], out=weight)  # row-major
    elif g.shape[2] * g.shape[3] <= g.shape[1]:  # the output positions L = H'W' <= O
        weight = unfold_weight_grads(layer, a, g, out[0])
    else:
        weight = grouped_weight_grads(layer, a, g)
        weight = weight if out[0] is None else out[0].copy_(weight)
    grads = [weight]  # (B, O, C, kh, kw)
    if layer.bias is not None:
        grads.append(torch.sum(g, dim=(2, 3), out=out[1]))  # (B, O)
    return grads


def _geometry(layer: nn.Conv2d) -> dict:
    """The layer's ``stride``, ``padding`` (:func:`explicit_padding`) and ``dilation``."""
    return {"stride": layer.stride, "padding": explicit_padding(layer), "dilation": layer.dilation}


def one_image(x: torch.Tensor, channels_last: bool) -> torch.Tensor:
    """``x (B, C, H, W)`` as one image of ``B*C`` channels, ``(1, B*C, H, W)``."""
    image = x.reshape(1, -1, *x.shape[2:])
    return image.contiguous(memory_format=torch.channels_last) if channels_last else image


def grouped_weight_grads(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """Per-sample weight grads ``(B, O, C, kh, kw)``: the weight gradient of one convolution
    whose groups are the examples (``a`` as one image of ``B*C`` channels, ``g`` of ``B*O``)."""
    batch, out_channels = g.shape[:2]
    narrow = a.device.type == "cpu" and a.shape[1] < CHANNELS_LAST_BELOW
    images, out_grads = one_image(a, narrow), one_image(g, narrow)  # (1, B*C | B*O, H, W)
    shape = (batch * out_channels, *layer.weight.shape[1:])  # (B*O, C, kh, kw)
    weight = torch.nn.grad.conv2d_weight(images, shape, out_grads, groups=batch, **_geometry(layer))
    return weight.view(batch, out_channels, *layer.weight.shape[1:])


def unfold_weight_grads(
    layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Per-sample weight grads ``(B, O, C, kh, kw)``: ``g (B, O, L)`` times the patches
    ``(B, C*kh*kw, L)`` transposed, one batched matmul (into ``out`` where given)."""
    patches = F.unfold(a, layer.kernel_size, **_geometry(layer))  # (B, C*kh*kw, L)
    flat = None if out is None else out.view(*out.shape[:2], -1)  # (B, O, C*kh*kw)
    weight = torch.bmm(g.flatten(2), patches.transpose(1, 2), out=flat)  # (B, O, C*kh*kw)
    return weight.view(*g.shape[:2], *layer.weight.shape[1:])


class PlainInputGrad(torch.autograd.Function):
    """The identity, whose backward gives the gradient in the memory format of its input, as a
    plain convolution's input gradient is: a channels-last one (of :func:`one_image`) reaching
    the layers before made their backward wrong (torch's CPU ``instance_norm``, a user's
    ``grad.view(-1)``; adversarial round 36)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        channels_last = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
        ctx.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.contiguous(memory_format=ctx.memory_format)


def copy_weight(layer: nn.Conv2d, keep: Callable[[torch.Tensor], None]) -> Callable | None:
    """On the CPU, a narrow layer (LeNet's) runs as one convolution grouped by example over its
    weight copied per example (``keep``'s ``(B * O, C, kh, kw)``), whose weight gradient in the
    one backward is :func:`grouped_weight_grads`' and adds up to ``weight.grad``: no second one."""
    if layer.weight.device.type != "cpu" or layer.in_channels >= CHANNELS_LAST_BELOW:
        return None

    def grouped(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None):
        # unbatched, no weight gradient, or in a checkpoint (whose recompute is the plain forward)
        checkpointed = torch._C._autograd._top_saved_tensors_default_hooks(False) is not None
        if x.dim() != 4 or not (weight.requires_grad and torch.is_grad_enabled()) or checkpointed:
            return type(layer)._conv_forward(layer, x, weight, bias)
        batch, out_channels = x.shape[0], weight.shape[0]  # x (B, C, H, W)
        weights = weight.expand(batch, *weight.shape).reshape(-1, *weight.shape[1:])
        keep(weights)  # (B * O, C, kh, kw)
        x = PlainInputGrad.apply(x) if x.requires_grad else x
        images = one_image(x, channels_last=True)  # (1, B * C, H, W)
        biases = None if bias is None else bias.expand(batch, -1).reshape(-1)  # (B * O,)
        out = F.conv2d(images, weights, biases, groups=batch, **_geometry(layer))
        return out.view(batch, out_channels, *out.shape[2:]).contiguous()  # (B, O, H', W')

    layer._conv_forward = grouped
    return lambda: delattr(layer, "_conv_forward")


@register_rule(nn.Conv2d)
class Conv2dRule(LayerRule):
    """``nn.Conv2d``; grouped, non-zero-padded, asymmetric ``"same"`` ones and those whose
    ``_conv_forward`` is not ``nn.Conv2d``'s (a subclass's, one set on the instance): fallback."""

    def supports(self, layer):
        zero_padded = layer.padding_mode == "zeros" and explicit_padding(layer) is not None
        own = vars(layer).get("_conv_forward", type(layer)._conv_forward) is nn.Conv2d._conv_forward
        return layer.groups == 1 and zero_padded and own

    per_sample, copy_weight = staticmethod(conv2d_grads), staticmethod(copy_weight)
