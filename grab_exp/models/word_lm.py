"""The GraB paper's word language model: embedding, a 2-layer LSTM, a linear decoder."""

from __future__ import annotations

import torch
from torch import nn


class WordLM(nn.Module):
    """Embedding -> dropout -> LSTM -> dropout -> Linear over the vocabulary.

    Dropout is a module (``dropout > 0``; none at 0): the hook path of per-sample gradients
    takes the masks of the batch's own forward. The decoder is not tied to the embedding (tied
    weights make ``method=auto`` take ``func``).

    Args:
        num_classes: the vocabulary's size (the logits per position).
        width: the embedding's and the LSTM's width.
        layers: LSTM layers.
        dropout: dropout on the embeddings and on the LSTM's outputs, in ``[0, 1)``.
    """

    def __init__(
        self, num_classes: int = 10_000, width: int = 256, layers: int = 2, dropout: float = 0.0
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(num_classes, width)
        self.drop = nn.Dropout(dropout) if dropout else nn.Identity()  # 0: no module to run
        self.lstm = nn.LSTM(width, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, num_classes)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``(B, T)`` token ids -> ``(B, T, num_classes)`` next-token logits."""
        out, _ = self.lstm(self.drop(self.embed(tokens)))  # (B, T, width)
        return self.head(self.drop(out))
