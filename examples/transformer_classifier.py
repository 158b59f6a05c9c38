"""A Transformer classifier with dropout (token and learned position embeddings, 2 encoder
layers) on the help text that ships with Python: which of four help topics a window of 24
words comes from. GraB against random reshuffling.

The encoder's attention dropout is drawn inside ``nn.MultiheadAttention``, where replaying one
layer cannot reproduce it, so ``method="auto"`` takes ``func`` with a mask drawn per example
(it prints the method after training); ``--attention-dropout 0`` keeps dropout in the encoder's own
Dropout modules only, and the hook path (``factored``: the embeddings' rows kept compact).

    python examples/transformer_classifier.py --epochs 3
"""

from __future__ import annotations

import re
from pydoc_data.topics import topics

import torch
from grab_vs_rr import arguments, compare
from torch import nn
from torch.nn import functional as F
from torch.utils.data import TensorDataset

SEQ, VOCAB = 24, 1500
TOPICS = ("compound", "formatstrings", "specialnames", "types")


def windows(examples: int) -> TensorDataset:
    """Word-id windows ``(N, SEQ)`` and their topic ``(N,)``, the topics taken in turn."""
    texts = [re.findall(r"[a-z]+", topics[t].lower()) for t in TOPICS]
    counts: dict[str, int] = {}
    for word in (w for text in texts for w in text):
        counts[word] = counts.get(word, 0) + 1
    vocab = {w: i + 1 for i, w in enumerate(sorted(counts, key=counts.get, reverse=True)[:VOCAB])}
    per_topic = [
        [[vocab.get(w, 0) for w in text[s : s + SEQ]] for s in range(0, len(text) - SEQ, SEQ)]
        for text in texts
    ]
    turns = zip(*per_topic, strict=False)  # as many windows of each topic as the shortest has
    rows = [(w, label) for group in turns for label, w in enumerate(group)][:examples]
    x = torch.tensor([w for w, _ in rows])
    return TensorDataset(x, torch.tensor([label for _, label in rows]))


class TransformerClassifier(nn.Module):
    """Embeddings -> TransformerEncoder (2 layers, dropout) -> mean over words -> Linear."""

    def __init__(self, width: int = 32, attention_dropout: float = 0.1) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB + 1, width)
        self.pos = nn.Embedding(SEQ, width)  # applied to arange(T): no batch dimension
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=0.1, batch_first=True)
        layer.self_attn.dropout = attention_dropout
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, len(TOPICS))

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:  # (B, T) -> (B, classes)
        h = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
        return self.head(self.encoder(h).mean(dim=1))


if __name__ == "__main__":
    args = arguments(
        __doc__.splitlines()[0], epochs=3, examples=1600,
        attention_dropout=(0.1, "dropout of the attention weights (0: the hook path)"),
    )  # fmt: skip
    model = lambda: TransformerClassifier(attention_dropout=args.attention_dropout)  # noqa: E731
    compare(model, windows(args.examples), F.cross_entropy, args)
