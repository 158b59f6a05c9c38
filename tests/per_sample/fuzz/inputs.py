"""The fuzzer's batches: inputs of each family, packed as a tensor, a dict (keyword inputs with
Python values) or a tuple (positional, with Python values), and the loss's targets.

Sizes run from 1 to 40 (mostly small); sequence lengths change between calls; the first
example of a token batch may have length 1 (``batch:first_len1``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._pytree import tree_map

from .losses import CLASS_WEIGHTS, IGNORE
from .models import CLASSES, IN, PAD, VOCAB

F64 = torch.float64


def batch_size(draw) -> int:
    """1-40, mostly 1-8."""
    return draw.int(1, 40) if draw.rng.random() < 0.15 else draw.int(1, 8)


def raw_input(draw, family: str, b: int, t: int, g: torch.Generator) -> torch.Tensor:
    """``family``'s input for ``b`` examples of length ``t`` (token ids padded with ``PAD``)."""
    if family == "vec":
        return torch.randn(b, IN, generator=g, dtype=F64)
    if family == "img":
        return torch.randn(b, 3, 6, 6, generator=g, dtype=F64)
    if family == "seq":
        return torch.randn(b, 3, t, generator=g, dtype=F64)
    ids = torch.randint(1, VOCAB, (b, t), generator=g)
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    if draw.chance("batch:first_len1", 0.1):
        lengths[0] = 1
    ids[torch.arange(t)[None] >= lengths[:, None]] = PAD
    return ids


def pack(draw, packing: str, x: torch.Tensor, family: str) -> Any:
    """``x`` as the model takes it: a tensor, ``{"x", "mask"?, "scale", "flag"}`` or
    ``(x, None, scale)``; the ``flag`` (a Python bool) may change between calls."""
    if packing == "tensor":
        return x
    scale = float(draw.int(1, 4)) / 2
    if packing == "tuple":
        return (x, None, scale)
    out: dict[str, Any] = {"x": x, "scale": scale, "flag": draw.rng.random() < 0.6}
    if family in ("tok", "lm") and draw.rng.random() < 0.7:
        out["mask"] = x != PAD
    return out


def targets(draw, loss: str, x: torch.Tensor, b: int, g: torch.Generator) -> Any:
    """The targets ``loss`` takes for ``b`` examples (``x``: token ids for token losses)."""
    if loss.startswith("token"):
        y = torch.randint(0, VOCAB, x.shape, generator=g)
        y[x == PAD] = IGNORE
        return y
    labels = torch.randint(0, CLASSES, (b,), generator=g)
    if loss == "soft":
        return torch.rand(b, CLASSES, generator=g, dtype=F64).softmax(1)
    if loss == "ignore" and draw.rng.random() < 0.5:
        labels[torch.rand(b, generator=g) < 0.3] = IGNORE
    if loss == "tuple":
        return (labels, CLASS_WEIGHTS[labels])
    return labels


def batches(draw, family: str, loss: str, calls: int) -> list[tuple[Any, Any]]:
    """``calls`` batches ``(x, y)``, packed one way for the whole case (``input:...``)."""
    packing = draw.pick("input", ["tensor", "dict", "tuple"], [0.5, 0.3, 0.2])
    g = draw.generator()
    out = []
    for _ in range(calls):
        b, t = batch_size(draw), draw.int(3, 7)
        x = raw_input(draw, family, b, t, g)
        out.append((pack(draw, packing, x, family), targets(draw, loss, x, b, g)))
    return out


def same_shape(draw, family: str, loss: str, data: list[tuple[Any, Any]], calls: int) -> list:
    """``calls`` batches of the shape and packing of ``data``'s first (new examples each), as a
    training loop's steps: the calls between the check's schedule (1, 2, 4, ...) are of a kind of
    batch already checked."""
    x0 = data[0][0]
    packing = "dict" if isinstance(x0, dict) else "tuple" if isinstance(x0, tuple) else "tensor"
    first = x0["x"] if packing == "dict" else x0[0] if packing == "tuple" else x0
    b, t = first.shape[0], first.shape[-1] if first.dim() > 1 else 1
    g = draw.generator()
    out = []
    for _ in range(calls):
        x = raw_input(draw, family, b, t, g)
        out.append((pack(draw, packing, x, family), targets(draw, loss, x, b, g)))
    return out


def example(x: Any, i: int) -> Any:
    """Example ``i`` of a batch (inputs or targets), as a batch of one: every tensor sliced,
    Python values kept."""
    if isinstance(x, torch.Tensor):
        return x[i : i + 1]
    if isinstance(x, dict):
        return {k: example(v, i) for k, v in x.items()}
    if isinstance(x, tuple):
        return tuple(example(v, i) for v in x)
    return x


def sorted_on_checks(x: Any, y: Any, calls: int) -> list[tuple[Any, Any]]:
    """``sched:sorted_checks``: the batch ``x, y`` on every call, its examples in the order of the
    model's input's first entry on the calls the schedule checks (1, 2 and 4), in reverse on the
    others (``Net.sort_neck`` takes its batch apart and puts it back in that order)."""
    first = x["x"] if isinstance(x, dict) else x[0] if isinstance(x, tuple) else x
    up = first.flatten(1)[:, 0].argsort()
    orders = [up if call in (0, 1, 3) else up.flip(0) for call in range(calls)]
    pick = lambda v, o: v[o] if isinstance(v, torch.Tensor) else v  # noqa: E731
    return [tree_map(lambda v, o=o: pick(v, o), (x, y)) for o in orders]


def call_model(model, x: Any) -> Any:
    """``model(x)``, ``model(**x)`` or ``model(*x)``."""
    if isinstance(x, dict):
        return model(**x)
    return model(*x) if isinstance(x, tuple) else model(x)


def size(y: Any) -> int:
    """The batch size of targets ``y`` (a tensor or a tuple of them)."""
    return len(y[0]) if isinstance(y, tuple) else len(y)
