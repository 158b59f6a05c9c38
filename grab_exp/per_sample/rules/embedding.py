"""``nn.Embedding``: each example's gradient is its output gradients added into its token rows."""

from __future__ import annotations

from torch import nn

from grab_exp.grads.embedding import EmbeddingRows, compact_pays
from grab_exp.per_sample.rules.base import LayerRule, register_rule


@register_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    """``nn.Embedding`` without ``max_norm`` (it rewrites the weight in the forward) or
    ``scale_grad_by_freq`` (those: the fallback); a ``sparse`` one's ``param.grad`` stays sparse."""

    has_factors = True

    def supports(self, layer):
        return layer.max_norm is None and not layer.scale_grad_by_freq

    def per_sample(self, layer, a, g, out=(None,)):  # [(B, V, D)]
        rows = EmbeddingRows.of(layer, a, g)
        weight = g.new_empty(rows.rows, *layer.weight.shape) if out[0] is None else out[0]
        rows.write(weight.view(rows.rows, -1))
        return [weight]

    def weighted_sum(self, layer, a, g, coef, acc) -> None:  # from B*T*D values, not B*V*D
        EmbeddingRows.of(layer, a, g).accumulate(acc.view(-1), coef)

    def factors(self, layer, a, g):
        rows = EmbeddingRows.of(layer, a, g)
        return [rows] if compact_pays(rows.tokens.shape[1], rows.vocab) else None
