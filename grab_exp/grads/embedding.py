"""An Embedding's per-sample gradients, compact: ``g_i = sum_t e_{tokens[i, t]} ⊗ values[i, t]``.

Example ``i``'s gradient adds its ``T`` output gradients ``values[i, t] (D,)`` into the weight's
rows ``tokens[i, t]``: ``B * T * D`` numbers where the materialized rows hold ``B * V * D``,
mostly zeros. Then

* ``<g_i, Acc> = sum_t values[i, t] · Acc[tokens[i, t]]``: a gather and a row dot;
* ``<g_i, g_j> = sum_tt' [tokens[i, t] = tokens[j, t']] values[i, t] · values[j, t']``;
* ``sum_i s_i g_i``: one ``index_add_`` of the weighted values into the rows of their tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from grab_exp.grads.rows import GradRows


def compact_pays(steps: int, vocab: int) -> bool:
    """Whether an Embedding's rows are cheaper compact: ``T² <= V`` (the compact Gram matrix
    costs ``(BT)² D``, the materialized one ``B² V D``, plus writing ``B V D`` values; ``T >= 1``:
    an empty sequence's rows are zeros, read as a matrix)."""
    return 0 < steps * steps <= vocab


@dataclass(frozen=True, eq=False)
class EmbeddingRows(GradRows):
    """``g_i = sum_t e_{tokens[i, t]} ⊗ values[i, t]``: ``tokens (B, T)`` indices into ``vocab``
    rows, ``values (B, T, D)``. Accumulators are the weight's columns: ``(V * D,)`` or
    ``(K, V * D)``."""

    tokens: torch.Tensor  # (B, T)
    values: torch.Tensor  # (B, T, D)
    vocab: int
    factored = True

    @classmethod
    def of(cls, layer: nn.Embedding, indices: torch.Tensor, grads: torch.Tensor) -> EmbeddingRows:
        """The rows of ``layer`` from its ``indices (B, *)`` and output gradients ``grads (B, *,
        D)``; none at its ``padding_idx`` (that row of the weight gets no gradient)."""
        tokens = indices.reshape(indices.shape[0], -1)  # (B, T)
        values = grads.reshape(*tokens.shape, grads.shape[-1])  # (B, T, D)
        if layer.padding_idx is not None:
            values = values * (tokens != layer.padding_idx)[..., None]
        return cls(tokens, values, layer.weight.shape[0])

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def like(self) -> torch.Tensor:
        return self.values

    @property
    def width(self) -> int:
        return self.vocab * self.values.shape[-1]

    def to(self, device, dtype) -> EmbeddingRows:
        return EmbeddingRows(self.tokens.to(device), self.values.to(device, dtype), self.vocab)

    def _table(self, acc: torch.Tensor) -> torch.Tensor:
        """``acc (..., V * D)`` as ``(..., V, D)``."""
        return acc.unflatten(-1, (self.vocab, self.values.shape[-1]))

    def _per_step(self, coef: torch.Tensor) -> torch.Tensor:
        """``coef (B, ...)`` repeated over ``T``: ``(BT, ...)``."""
        steps = self.tokens.shape[1]
        return coef.repeat_interleave(steps, dim=0)

    def dots(self, acc):
        picked = self._table(acc)[..., self.tokens, :]  # (B, T, D) or (K, B, T, D)
        if acc.dim() == 1:
            return (picked * self.values).sum((1, 2))  # (B,)
        return (picked * self.values).sum((2, 3)).T  # (B, K)

    def gram(self):
        tokens, values = self.tokens.reshape(-1), self.values.flatten(0, 1)  # (BT,), (BT, D)
        products = (values @ values.T).mul_(tokens[:, None] == tokens[None, :])  # (BT, BT)
        rows, steps = self.tokens.shape
        return products.view(rows, steps, rows, steps).sum((1, 3))  # (B, B)

    def accumulate(self, acc, coef):
        tokens, values = self.tokens.reshape(-1), self.values.flatten(0, 1)  # (BT,), (BT, D)
        weights = self._per_step(coef)  # (BT,) or (BT, K)
        if acc.dim() == 1:
            self._table(acc).index_add_(0, tokens, (values * weights[:, None]).to(acc.dtype))
        else:
            weighted = (weights.T[:, :, None] * values).to(acc.dtype)  # (K, BT, D)
            self._table(acc).index_add_(1, tokens, weighted)

    def write(self, out):
        table = self._table(out).zero_()  # (B, V, D)
        examples = torch.arange(self.rows, device=out.device)[:, None].expand_as(self.tokens)
        table.index_put_((examples, self.tokens), self.values, accumulate=True)

    def write_row(self, i, out):
        self._table(out).zero_().index_put_((self.tokens[i],), self.values[i], accumulate=True)
