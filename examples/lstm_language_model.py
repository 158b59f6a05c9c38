"""The GraB paper's word language model (Embedding + 2-layer LSTM + Linear) on the help text
that ships with Python (``pydoc_data.topics``, about 64,000 words), GraB against random
reshuffling. Each training example is a window of 35 words and its next-word targets.

    python examples/lstm_language_model.py --epochs 3
"""

from __future__ import annotations

import re
from collections import Counter
from pydoc_data.topics import topics

import torch
from grab_vs_rr import arguments, compare
from torch.nn import functional as F
from torch.utils.data import TensorDataset

from grab_exp.models import WordLM  # the model=word_lm preset of the runner

SEQ, VOCAB = 35, 2000  # words per example; most frequent words kept (the rest are <unk>)


def corpus(examples: int) -> TensorDataset:
    """``examples`` windows of ``SEQ`` word ids and the ids one word later."""
    words = re.findall(r"[a-z]+|[^\sa-z]", " ".join(topics[k] for k in sorted(topics)).lower())
    ids = {w: i + 1 for i, (w, _) in enumerate(Counter(words).most_common(VOCAB - 1))}
    stream = torch.tensor([ids.get(w, 0) for w in words])  # 0: <unk>
    windows = min(examples, (len(stream) - 1) // SEQ)
    x = stream[: windows * SEQ].view(windows, SEQ)
    y = stream[1 : windows * SEQ + 1].view(windows, SEQ)
    return TensorDataset(x, y)


def word_lm() -> WordLM:
    """The paper's model, small: width 64, dropout 0.2 (a module: the hook path takes the
    batch's masks)."""
    return WordLM(num_classes=VOCAB, width=64, dropout=0.2)


def next_word_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-word cross-entropy: every example has ``SEQ`` words, so this is the batch mean
    of the examples' own mean losses (the loss contract of per-sample gradients)."""
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


if __name__ == "__main__":
    args = arguments(__doc__.splitlines()[0], epochs=3, examples=1800)
    compare(word_lm, corpus(args.examples), next_word_loss, args, lr=0.5)
