"""``nn.Conv2d`` (``groups=1``, zero padding): per-sample grads as one grouped convolution."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from grab_exp.per_sample.rules.base import LayerRule, Outs, register_rule


def conv2d_grads(
    layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor, out: Outs = (None, None)
) -> list[torch.Tensor]:
    """Per-sample ``[weight, bias]`` grads from input ``a (B, C, H, W)``, ``g (B, O, H', W')``.

    ``dW[b, o, c, i, j] = sum_pq g[b, o, p, q] a[b, c, p*stride + i*dilation, ...]`` is itself a
    convolution: channels become the batch, every example's output gradient becomes a group's
    kernel, and stride and dilation swap roles. One grouped convolution is faster here than
    ``unfold`` + ``bmm`` and never materializes the ``(B, C*kh*kw, L)`` patches. ``out``:
    optional ``(B, O, C, kh, kw)`` / ``(B, O)`` tensors to write the results into.
    """
    batch, out_channels = g.shape[:2]
    kh, kw = layer.weight.shape[2:]
    weight = F.conv2d(
        a.transpose(0, 1),  # (C, B, H, W): channels as the batch
        g.reshape(batch * out_channels, 1, *g.shape[2:]),  # (B*O, 1, H', W'): one group per b
        padding=layer.padding,
        stride=layer.dilation,
        dilation=layer.stride,
        groups=batch,
    )[..., :kh, :kw]  # (C, B*O, kh, kw); padding arithmetic can leave extra rows to crop
    weight = weight.reshape(-1, batch, out_channels, kh, kw).permute(1, 2, 0, 3, 4)
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
    """``nn.Conv2d``; grouped or non-zero-padded ones get the ``torch.func`` fallback."""

    def supports(self, layer):
        return layer.groups == 1 and layer.padding_mode == "zeros"

    def per_sample(self, layer, a, g, out=(None, None)):
        return conv2d_grads(layer, a, g, out)

    def mean(self, layer, a, g, per_sample):
        return conv2d_mean_grads(layer, g, per_sample)
