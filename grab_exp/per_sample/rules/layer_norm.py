"""``nn.LayerNorm``: per-sample grads from the normalized input and the output gradient."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from grab_exp.per_sample.rules.base import LayerRule, Outs, register_rule


def layer_norm_grads(
    layer: nn.LayerNorm, a: torch.Tensor, g: torch.Tensor, out: Outs = (None, None)
) -> list[torch.Tensor]:
    """Per-sample ``[weight, bias]`` grads from ``a, g (B, *, *S)`` (``S``: ``normalized_shape``):
    ``sum_* g * a_hat`` and ``sum_* g``, ``a_hat`` the input normalized without the affine map."""
    a_hat = F.layer_norm(a, layer.normalized_shape, eps=layer.eps)  # (B, *, *S)
    lead = tuple(range(1, a.dim() - len(layer.normalized_shape)))  # the * dims
    grads = [_sum_lead(g * a_hat, lead, out[0])]  # (B, *S)
    if layer.bias is not None:
        grads.append(_sum_lead(g, lead, out[1]))  # (B, *S)
    return grads


def _sum_lead(t: torch.Tensor, lead: tuple[int, ...], out: torch.Tensor | None) -> torch.Tensor:
    """``t (B, *, *S)`` summed over ``*`` -> ``(B, *S)`` (``dim=()`` would sum everything)."""
    if lead:
        return torch.sum(t, dim=lead, out=out)
    return t if out is None else out.copy_(t)


@register_rule(nn.LayerNorm)
class LayerNormRule(LayerRule):
    """``nn.LayerNorm`` with ``elementwise_affine`` (with or without bias)."""

    per_sample = staticmethod(layer_norm_grads)
