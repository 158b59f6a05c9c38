"""``nn.Linear``: per-sample grads are outer products of the output gradient and the input."""

from __future__ import annotations

import torch
from torch import nn

from grab_exp.grads.linear import FactorBias, LinearFactors, factor_pays
from grab_exp.per_sample.rules.base import LayerRule, Outs, register_rule


def linear_grads(
    layer: nn.Linear, a: torch.Tensor, g: torch.Tensor, out: Outs = (None, None)
) -> list[torch.Tensor]:
    """Per-sample ``[weight, bias]`` grads from ``a (B, *, in)`` and out-grad ``g (B, *, out)``."""
    a3, g3 = (t.reshape(t.shape[0], -1, t.shape[-1]) for t in (a, g))  # (B, T, in / out)
    # T = 1 (the usual case): an outer product, as a broadcast multiply (faster than a bmm)
    product = torch.mul if a3.shape[1] == 1 else torch.bmm
    grads = [product(g3.transpose(1, 2), a3, out=out[0])]  # (B, out, in)
    if layer.bias is not None:
        grads.append(torch.sum(g3, dim=1, out=out[1]))  # (B, out)
    return grads


@register_rule(nn.Linear)
class LinearRule(LayerRule):
    """``nn.Linear`` (and subclasses, e.g. ``LazyLinear`` once materialized)."""

    per_sample = staticmethod(linear_grads)
    has_factors = True

    def factors(self, layer, a, g):
        a3, g3 = (t.reshape(t.shape[0], -1, t.shape[-1]) for t in (a, g))  # (B, T, in / out)
        if not factor_pays(a3.shape[1], a3.shape[2], g3.shape[2]):
            return None  # long sequences, narrow layer: the (B, out, in) blocks are cheaper
        factors = LinearFactors(a3, g3)
        return [factors] if layer.bias is None else [factors, FactorBias(factors)]
