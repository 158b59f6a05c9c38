"""Models of the kinds users bring (small, for tests): sequence models, attention, position
embeddings, sequence-first layouts, a tiny HuggingFace BERT, ResNets with GroupNorm.

Each builder takes ``(batch, seq)`` where it has a sequence and returns ``(model, x, y)``: a float64
model and a batch whose per-sample gradients the tests compare with a per-example loop.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, CLASSES = 50, 3


def _tokens(batch: int, seq: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (batch, seq), generator=torch.Generator().manual_seed(seed))


def _labels(batch: int, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, CLASSES, (batch,), generator=torch.Generator().manual_seed(seed))


class WordLM(nn.Module):
    """Embedding + LSTM + Linear, the GraB paper's word language model, predicting the token
    after the sequence (a classifier over the vocabulary)."""

    def __init__(self, rnn: str = "LSTM", batch_first: bool = True, layers: int = 2, dropout=0.0):
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(VOCAB, 8)
        self.rnn = getattr(nn, rnn)(8, 12, num_layers=layers, batch_first=batch_first,
                                    dropout=dropout)  # fmt: skip
        self.head = nn.Linear(12, VOCAB)

    def forward(self, tokens):  # (B, T)
        h = self.embed(tokens if self.batch_first else tokens.T)  # (B, T, 8) or (T, B, 8)
        out, _ = self.rnn(h)
        last = out[:, -1] if self.batch_first else out[-1]  # (B, 12)
        return self.head(last)


class GRUClassifier(nn.Module):
    """A GRU over embedded tokens, classified from its last hidden state."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 8)
        self.gru = nn.GRU(8, 32, batch_first=True)
        self.head = nn.Linear(32, CLASSES)

    def forward(self, tokens):
        _, h = self.gru(self.embed(tokens))  # h: (1, B, 32)
        return self.head(h[-1])


class TransformerClassifier(nn.Module):
    """Token + learned position embeddings, ``nn.TransformerEncoder`` (2 layers), mean pool."""

    def __init__(self, dropout: float = 0.0, batch_first: bool = True, seq: int = 6):
        super().__init__()
        self.batch_first = batch_first
        self.embed = nn.Embedding(VOCAB, 16)
        self.pos = nn.Embedding(seq, 16)
        layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=dropout, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.drop = nn.Dropout(dropout)
        self.head = nn.Linear(16, CLASSES)

    def forward(self, tokens):  # (B, T)
        h = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))  # (B, T, 16)
        if not self.batch_first:
            return self.head(self.drop(self.encoder(h.transpose(0, 1)).mean(0)))
        return self.head(self.drop(self.encoder(h).mean(1)))


class PositionModel(nn.Module):
    """Token + learned position embedding of ``arange(T)``: the position input has no batch."""

    def __init__(self, seq: int) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 6)
        self.pos = nn.Embedding(seq, 6)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, tokens):
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))  # (B, T, 6)
        return self.head(torch.tanh(h).mean(1))


class SequenceFirst(nn.Module):
    """A Linear and a LayerNorm applied to sequence-first ``(T, B, D)`` activations."""

    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, 6)
        self.mix = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)
        self.head = nn.Linear(6, CLASSES)

    def forward(self, tokens):
        h = self.tok(tokens).transpose(0, 1)  # (T, B, 6)
        h = self.norm(torch.tanh(self.mix(h)))  # (T, B, 6)
        return self.head(h.mean(0))


def tiny_bert(seq: int):
    """A 2-layer HuggingFace BERT built from a config (no weights), classifying sequences."""
    transformers = __import__("transformers")
    config = transformers.BertConfig(
        vocab_size=VOCAB, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=max(seq, 8), num_labels=CLASSES,
        hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    bert = transformers.BertForSequenceClassification(config)
    return HFLogits(bert)


class HFLogits(nn.Module):
    """A HuggingFace model as ``tokens -> logits``."""

    def __init__(self, hf: nn.Module) -> None:
        super().__init__()
        self.hf = hf

    def forward(self, tokens):
        return self.hf(input_ids=tokens).logits


def sequence_case(make, batch: int, seq: int):
    """``(model, x, y)`` for a sequence model, float64, in training mode."""
    torch.manual_seed(0)
    model = make().double()
    return model, _tokens(batch, seq), _labels(batch)
