"""``nn.Embedding``: each example's gradient is its output gradients added into its token rows."""

from __future__ import annotations

import torch
from torch import nn

from grab_exp.per_sample.rules.base import LayerRule, Outs, register_rule


def token_grads(layer: nn.Embedding, a: torch.Tensor, g: torch.Tensor):
    """Indices ``(B, T)`` of ``a (B, *)``, their gradients ``(B, T, D)`` of ``g (B, *, D)``: 0
    at ``padding_idx`` (its row stays zero)."""
    tokens, g3 = a.reshape(a.shape[0], -1), g.reshape(a.shape[0], -1, layer.weight.shape[1])
    padding = layer.padding_idx
    return tokens, g3 if padding is None else g3 * (tokens != padding)[..., None]


def embedding_grads(layer: nn.Embedding, a, g, out: Outs = (None,)) -> list[torch.Tensor]:
    """Per-sample ``[weight]`` grads ``(B, V, D)``: one accumulating ``index_put_`` of the
    :func:`token_grads` at ``(example, index)``."""
    tokens, g3 = token_grads(layer, a, g)
    weight = g.new_zeros(len(tokens), *layer.weight.shape) if out[0] is None else out[0].zero_()
    examples = torch.arange(len(tokens), device=a.device)[:, None].expand_as(tokens)  # (B, T)
    return [weight.index_put_((examples, tokens), g3, accumulate=True)]  # (B, V, D)


def embedding_sum(layer: nn.Embedding, a, g, coef: torch.Tensor, acc: torch.Tensor) -> None:
    """``acc (V, D) += sum_i coef_i`` of :func:`embedding_grads`' rows, read from the ``B*T``
    :func:`token_grads` (not the ``B*V*D`` rows, mostly zeros)."""
    tokens, g3 = token_grads(layer, a, g)
    acc.index_add_(0, tokens.flatten(), (g3 * coef[:, None, None]).to(acc.dtype).flatten(0, 1))


@register_rule(nn.Embedding)
class EmbeddingRule(LayerRule):
    """``nn.Embedding`` without ``max_norm`` (it rewrites the weight in the forward) or
    ``scale_grad_by_freq`` (those: the fallback); a ``sparse`` one's ``param.grad`` stays sparse."""

    def supports(self, layer):
        return layer.max_norm is None and not layer.scale_grad_by_freq

    per_sample, weighted_sum = staticmethod(embedding_grads), staticmethod(embedding_sum)
