"""The fuzzer's losses: ``loss_fn(out, y)``, some the batch mean of per-example losses (right
on every method), some refused by design (:data:`BY_DESIGN` in :mod:`fuzz.oracle`).

Class losses take ``(B, C)`` logits: ``ce``, ``smooth`` (label smoothing), ``manual_weights``
(``(w[y] * ce).mean()``), ``weight_mean`` (``weight=`` with ``reduction="mean"``: refused once a
batch mixes weights), ``sum`` (refused for ``B > 1``), ``soft`` (probability targets), ``mse``,
``nll``, ``ignore`` (labels ``-100`` in some batches: refused), ``stateful`` (counts its calls
and keeps its last value; the value does not depend on them) and ``tuple`` (``y`` is
``(labels, per-example weights)``). Token losses take ``(B, T, V)``: ``token_mean`` (each
example's token mean, then the mean), ``token_flat`` (``ignore_index`` over the batch's tokens:
refused once padding is uneven), ``token_sum`` (each example's token sum, averaged) and
``token_smooth``.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from .models import CLASSES

IGNORE = -100
CLASS_LOSSES = ["ce", "smooth", "manual_weights", "weight_mean", "sum", "soft", "mse", "nll"]
CLASS_LOSSES += ["ignore", "stateful", "tuple"]
TOKEN_LOSSES = ["token_mean", "token_flat", "token_sum", "token_smooth"]
#: per-class weights of the weighted losses
CLASS_WEIGHTS = torch.tensor([1.0, 2.0, 0.5, 4.0], dtype=torch.float64)


class Stateful:
    """Cross-entropy that counts its calls and keeps its last value (state that must not leak
    into the value), or with ``reads`` (``loss:reads_calls``) scaled by its count (a schedule in
    the loss, as KL annealing's): each plain step's call advances it once."""

    def __init__(self) -> None:
        self.calls, self.last, self.reads = 0, None, False

    def __call__(self, out, y):
        self.calls += 1
        loss = F.cross_entropy(out, y) * (1 + 0.02 * self.calls if self.reads else 1)
        self.last = loss.detach()
        return loss


def class_loss(kind: str):
    """``loss_fn(out (B, C), y)`` of ``kind``; ``y`` is ``(B,)`` labels except for ``soft``
    (``(B, C)`` probabilities) and ``tuple`` (``((B,), (B,))``)."""
    if kind == "stateful":
        return Stateful()
    return _CLASS[kind]


def _token_mean(out, y, smoothing: float = 0.0):
    per_token = F.cross_entropy(
        out.transpose(1, 2), y, ignore_index=IGNORE, reduction="none", label_smoothing=smoothing
    )  # (B, T)
    real = (y != IGNORE).to(out.dtype)
    return ((per_token * real).sum(1) / real.sum(1)).mean()


_CLASS = {
    "ce": lambda out, y: F.cross_entropy(out, y),
    "smooth": lambda out, y: F.cross_entropy(out, y, label_smoothing=0.1),
    "manual_weights": lambda out, y: (
        CLASS_WEIGHTS.to(out.dtype)[y] * F.cross_entropy(out, y, reduction="none")
    ).mean(),
    "weight_mean": lambda out, y: F.cross_entropy(out, y, weight=CLASS_WEIGHTS.to(out.dtype)),
    "sum": lambda out, y: F.cross_entropy(out, y, reduction="sum"),
    "soft": lambda out, y: F.cross_entropy(out, y),
    "mse": lambda out, y: F.mse_loss(out.softmax(1), F.one_hot(y, CLASSES).to(out.dtype)),
    "nll": lambda out, y: F.nll_loss(out.log_softmax(1), y),
    "ignore": lambda out, y: F.cross_entropy(out, y, ignore_index=IGNORE),
    "tuple": lambda out, y: (y[1] * F.cross_entropy(out, y[0], reduction="none")).mean(),
    "token_mean": _token_mean,
    "token_flat": lambda out, y: F.cross_entropy(out.flatten(0, 1), y.flatten()),
    "token_sum": lambda out, y: (
        F.cross_entropy(out.flatten(0, 1), y.flatten(), reduction="sum") / out.shape[0]
    ),
    "token_smooth": lambda out, y: _token_mean(out, y, 0.1),
}


def token_loss(kind: str):
    """``loss_fn(out (B, T, V), y (B, T))`` of ``kind`` (``y`` is ``-100`` at padding)."""
    return _CLASS[kind]


def with_extras(loss_fn, model, aux: bool, store: bool):
    """``loss_fn`` on a dict output's logits plus ``0.1 * aux``, plus ``0.01 * mean(last**2)``
    read from the model (an activation kept on it)."""
    if not (aux or store):
        return loss_fn

    def loss(out, y):
        value = loss_fn(out["logits"], y) + 0.1 * out["aux"] if aux else loss_fn(out, y)
        return value + 0.01 * (model.last**2).mean() if store else value

    return loss
