"""``nn.Conv2d`` (``groups=1``, zero padding): per-sample grads as one grouped convolution's
weight gradient."""

from __future__ import annotations

import torch
from torch import nn

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
    layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, out: Outs = (None, None)
) -> list[torch.Tensor]:
    """Per-sample ``[weight, bias]`` grads from input ``a (B, C, H, W)``, ``g (B, O, H', W')``.

    The batch becomes the groups of one convolution: ``a`` as one image of ``B*C`` channels,
    ``g`` as ``B*O`` output channels, one group per example, and the weight gradient of that
    grouped convolution is every example's own ``(O, C, kh, kw)`` block. At LeNet's shapes this
    is faster than a grouped forward convolution with the roles swapped and than ``unfold`` +
    ``bmm`` (which also writes the ``(B, C*kh*kw, L)`` patches). The result may be a
    non-contiguous view (channels-last). ``out``: optional
    ``(B, O, C, kh, kw)`` / ``(B, O)`` tensors to write the results into.
    """
    batch, out_channels = g.shape[:2]
    images = a.reshape(1, -1, *a.shape[2:])  # (1, B*C, H, W)
    out_grads = g.reshape(1, -1, *g.shape[2:])  # (1, B*O, H', W')
    if a.device.type == "cpu" and a.shape[1] < CHANNELS_LAST_BELOW:
        images = images.contiguous(memory_format=torch.channels_last)
        out_grads = out_grads.contiguous(memory_format=torch.channels_last)
    weight = torch.nn.grad.conv2d_weight(
        images,
        (batch * out_channels, *layer.weight.shape[1:]),  # (B*O, C, kh, kw)
        out_grads,
        stride=layer.stride,
        padding=explicit_padding(layer),
        dilation=layer.dilation,
        groups=batch,
    ).view(batch, out_channels, *layer.weight.shape[1:])  # (B, O, C, kh, kw)
    grads = [weight if out[0] is None else out[0].copy_(weight)]  # (B, O, C, kh, kw)
    if layer.bias is not None:
        grads.append(torch.sum(g, dim=(2, 3), out=out[1]))  # (B, O)
    return grads


def conv2d_mean_grads(
    layer: nn.Conv2d, g: torch.Tensor, per_sample: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Batch-mean ``[weight, bias]`` grads: a sum of ``B`` small per-sample blocks.

    ``g (B, O, H', W')`` is the gradient of the batch MEAN loss; ``per_sample`` what
    :func:`conv2d_grads` returned.
    """
    grads = [per_sample[0].sum(dim=0).div_(g.shape[0])]  # (O, C, kh, kw)
    if layer.bias is not None:
        grads.append(g.sum(dim=(0, 2, 3)))  # (O,)
    return grads


@register_rule(nn.Conv2d)
class Conv2dRule(LayerRule):
    """``nn.Conv2d``; grouped, non-zero-padded or asymmetric ``"same"`` ones get the
    ``torch.func`` fallback."""

    def supports(self, layer):
        zero_padded = layer.padding_mode == "zeros" and explicit_padding(layer) is not None
        return layer.groups == 1 and zero_padded

    def per_sample(self, layer, a, g, out=(None, None)):
        return conv2d_grads(layer, a, g, out)

    def mean(self, layer, a, g, per_sample):
        return conv2d_mean_grads(layer, g, per_sample)
