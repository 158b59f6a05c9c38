"""Per-sample and mean gradients of ``nn.Linear`` / ``nn.Conv2d`` from inputs and output grads.

Each function takes a layer's input ``a`` and the gradient ``g`` at its output, both with the
batch first, and returns ``[weight, bias]`` gradients (``bias`` only when the layer has one).
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

Outs = tuple[torch.Tensor | None, torch.Tensor | None]  # where to write [weight, bias] grads


def linear_grads(
    layer: nn.Linear, a: torch.Tensor, g: torch.Tensor, out: Outs = (None, None)
) -> list[torch.Tensor]:
    """Per-sample ``[weight, bias]`` grads from ``a (B, *, in)`` and out-grad ``g (B, *, out)``.

    ``out``: optional ``(B, out, in)`` / ``(B, out)`` tensors to write the results into.
    """
    a3 = a.reshape(a.shape[0], -1, a.shape[-1])  # (B, T, in)
    g3 = g.reshape(g.shape[0], -1, g.shape[-1])  # (B, T, out)
    # T = 1 (the usual case): an outer product, as a broadcast multiply (faster than a bmm)
    product = torch.mul if a3.shape[1] == 1 else torch.bmm
    grads = [product(g3.transpose(1, 2), a3, out=out[0])]  # (B, out, in)
    if layer.bias is not None:
        grads.append(torch.sum(g3, dim=1, out=out[1]))  # (B, out)
    return grads


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


def mean_grads(
    layer: nn.Linear | nn.Conv2d, a: torch.Tensor, g: torch.Tensor, per_sample: list[torch.Tensor]
) -> list[torch.Tensor]:
    """Batch-mean ``[weight, bias]`` grads, as ``loss.backward()`` would give them.

    Args:
        layer: the layer.
        a: its input ``(B, ...)``.
        g: the gradient of the batch MEAN loss at its output ``(B, ...)`` (carries ``1/B``).
        per_sample: the layer's per-sample ``[weight, bias]`` grads ``(B, *shape)``.
    """
    if isinstance(layer, nn.Linear):  # the same matmul as autograd's
        g2, a2 = g.reshape(-1, g.shape[-1]), a.reshape(-1, a.shape[-1])  # (B*T, out), (B*T, in)
        grads = [g2.T @ a2]  # (out, in)
        sum_dims: tuple[int, ...] = (0,)
    else:  # a sum of B small per-sample blocks
        grads = [per_sample[0].sum(dim=0).div_(g.shape[0])]  # (O, C, kh, kw)
        g2, sum_dims = g, (0, 2, 3)
    if layer.bias is not None:
        grads.append(g2.sum(dim=sum_dims))  # (out,)
    return grads
