"""The references of one call: a plain ``loss_fn(model(x), y).backward()`` (``p.grad``) and a
per-example loop (rows), on a model of its own, in float64."""

from __future__ import annotations

import copy
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from .inputs import call_model, example, size


@dataclass
class Reference:
    """What one call must return.

    Attributes:
        loss: the batch loss ``()``.
        grads: parameter name -> the plain backward's ``p.grad`` (dense) or ``None``.
        rows: trainable parameter name -> ``(B, *shape)``, example ``i``'s gradient of its own
            loss (``backward`` per example: parameter hooks run as in training).
        generators: numpy's and Python's generators after the plain step (:func:`generators`).
    """

    loss: torch.Tensor
    grads: dict[str, torch.Tensor | None]
    rows: dict[str, torch.Tensor]
    generators: tuple


def seeded(seed: int) -> Callable[[], None]:
    """What sets numpy's global and Python's generators to one state (``seed``): each forward
    of a call's references, and the call, start from it (:class:`~fuzz.models.DrawnDropout`)."""

    def start() -> None:
        np.random.seed(seed % 2**32)
        random.seed(seed)

    return start


def generators() -> tuple:
    """numpy's global and Python's generator states, comparable with ``==``."""
    kind, keys, position, has_gauss, gauss = np.random.get_state()
    return (kind, keys.tobytes(), position, has_gauss, gauss), random.getstate()


def dense_grad(p: nn.Parameter) -> torch.Tensor | None:
    if p.grad is None:
        return None
    return p.grad.to_dense() if p.grad.is_sparse else p.grad.clone()


def reference(model: nn.Module, loss_fn, x: Any, y: Any, start=lambda: None) -> Reference:
    """The references of the batch ``(x, y)`` for ``model`` as it is now, each forward after
    ``start()`` (:func:`seeded`)."""
    model.zero_grad(set_to_none=True)
    before = buffers(model)  # every example runs on the model as the call found it
    found = dict(vars(loss_fn)) if hasattr(loss_fn, "__dict__") else {}  # and on the loss's
    start()
    loss = loss_fn(call_model(model, x), y)
    loss.backward()
    drawn = generators()
    after, left = buffers(model), dict(vars(loss_fn)) if found else {}
    grads = {n: dense_grad(p) for n, p in model.named_parameters()}
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    rows: dict[str, list[torch.Tensor]] = {n: [] for n, _ in named}
    for i in range(size(y)):
        model.zero_grad(set_to_none=True)
        load(model, before)
        if found:
            vars(loss_fn).update(found)
        start()
        loss_fn(call_model(model, example(x, i)), example(y, i)).backward()
        for n, p in named:
            g = dense_grad(p)
            rows[n].append(torch.zeros_like(p) if g is None else g)
    load(model, after)  # as one plain step leaves it
    if left:
        vars(loss_fn).update(left)
    model.zero_grad(set_to_none=True)
    rows_ = {n: torch.stack(r) for n, r in rows.items()}
    return Reference(loss.detach(), grads, rows_, drawn)


def state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's buffers and frozen parameters by name (what a forward may change)."""
    frozen = [(n, p) for n, p in model.named_parameters() if not p.requires_grad]
    return dict([*model.named_buffers(), *frozen])


def buffers(model: nn.Module) -> tuple[dict[str, torch.Tensor], list, list]:
    """Copies of :func:`state`, of the modules' attributes (a counter) and of what the model
    changes in place besides (a list's items, a tensor attribute's values)."""
    saved = {n: t.detach().clone() for n, t in state(model).items()}
    attributes = [(m, dict(vars(m))) for m in model.modules()]
    values = [v for _, kept in attributes for n, v in kept.items() if n in ("log", "count")]
    copies = [copy.copy(v) if isinstance(v, list) else v.clone() for v in values]
    return saved, attributes, list(zip(values, copies, strict=True))


@torch.no_grad()
def load(model: nn.Module, saved: tuple[dict[str, torch.Tensor], list, list]) -> None:
    """The buffers, frozen parameters and attributes as :func:`buffers` copied them."""
    tensors, attributes, values = saved
    for m, kept in attributes:
        if "lazy_n" in vars(m) and "lazy_n" not in kept:  # made since (attr:lazy_count)
            del vars(m)["lazy_n"]
        vars(m).update((n, v) for n, v in kept.items() if n != "training")
    for n, t in state(model).items():
        t.copy_(tensors[n])
    for value, copied in values:
        if isinstance(value, list):
            value[:] = copied
        else:
            value.copy_(copied)
