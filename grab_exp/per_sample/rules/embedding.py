"""``nn.Embedding``: each example's gradient is its output gradients added into its token rows."""

from __future__ import annotations

import torch
from torch import nn

from grab_exp.per_sample.rules.base import LayerRule, Outs, register_rule


def embedding_grads(
    layer: nn.Embedding, a: torch.Tensor, g: torch.Tensor, out: Outs = (None,)
) -> list[torch.Tensor]:
    """Per-sample ``[weight]`` grads ``(B, V, D)`` from indices ``a (B, *)`` and ``g (B, *, D)``:
    one accumulating ``index_put_`` at ``(example, index)`` (``padding_idx``'s row stays zero)."""
    batch, width = a.shape[0], layer.weight.shape[1]
    weight = g.new_zeros(batch, *layer.weight.shape) if out[0] is None else out[0].zero_()
    tokens = a.reshape(batch, -1)  # (B, T)
    examples = torch.arange(batch, device=a.device)[:, None].expand_as(tokens)  # (B, T)
    g3 = g.reshape(batch, -1, width)  # (B, T, D)
    if layer.padding_idx is not None:
        g3 = g3 * (tokens != layer.padding_idx)[..., None]  # (B, T, D)
    weight.index_put_((examples, tokens), g3, accumulate=True)  # (B, V, D)
    return [weight]


@register_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    """``nn.Embedding`` without ``max_norm`` (it rewrites the weight in the forward),
    ``scale_grad_by_freq`` or ``sparse``: those get the ``torch.func`` fallback."""

    def supports(self, layer):
        return layer.max_norm is None and not layer.scale_grad_by_freq and not layer.sparse

    per_sample = staticmethod(embedding_grads)
