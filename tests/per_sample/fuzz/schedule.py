"""Changes to the model between calls of one ``psg``: each a function ``change(model)`` that
draws from its own seed, so the model under test and its reference change alike.

``sched:tie_after`` ties two Linear weights after ``make_per_sample`` (what HF ``tie_weights()``
does), ``sched:param_hook`` registers a gradient hook on a parameter (masking some of its
entries), ``sched:fwd_hook`` a forward hook on a module, ``sched:freeze`` / ``sched:unfreeze``
switch ``requires_grad``, ``sched:replace_head`` puts a larger head in, ``sched:add_block``
appends a block, ``sched:step`` moves every parameter as an optimizer step would,
``sched:mode`` switches between training and eval mode, ``sched:mix_on`` turns mixup on;
``sched:sorted_checks`` (:func:`~fuzz.inputs.sorted_on_checks`) gives one batch in the order the
model's neck sorts by on the scheduled checks' calls only; ``sched:padding_mode`` makes the image
stem's narrow convolution pad by reflection, ``sched:reregister`` registers the head's weight
again after its bias (as ``prune.remove`` and ``remove_weight_norm`` do), ``sched:bias_none``
sets the head's bias to ``None``, ``sched:del_block`` deletes a block of the neck (``del
model.neck[i]``: no registration hook fires, and the blocks after it are renamed).
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from torch import nn

from .blocks import D, Wrap
from .models import reinit

Change = Callable[[nn.Module], None]
KINDS = ["tie_after", "param_hook", "fwd_hook", "freeze", "unfreeze", "replace_head"]
KINDS += ["add_block", "step", "mode"]


def linears(model: nn.Module) -> list[nn.Linear]:
    """The model's plain ``(D, D)`` Linear layers, in module order (not a spectral_norm's, whose
    ``weight`` its pre-hook computes)."""
    plain = [m for m in model.modules() if type(m) is nn.Linear and m.weight.shape == (D, D)]
    return [m for m in plain if isinstance(m.weight, nn.Parameter)]


def tie_after(model: nn.Module, g: torch.Generator) -> None:
    found = linears(model)
    if len(found) >= 2:
        found[-1].weight = found[0].weight


def param_hook(model: nn.Module, g: torch.Generator) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    p = params[int(torch.randint(len(params), (1,), generator=g))]
    mask = (torch.rand(p.shape, generator=g) < 0.5).to(p.dtype)
    p.register_hook(lambda grad: grad * mask)


def fwd_hook(model: nn.Module, g: torch.Generator) -> None:
    """A forward hook that scales the output of a random Linear (or of the head)."""
    found = linears(model) or [model.head]
    module = found[int(torch.randint(len(found), (1,), generator=g))]
    module.register_forward_hook(lambda m, i, o: o * 0.75)


def freeze(model: nn.Module, g: torch.Generator) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    if len(params) > 1:
        params[int(torch.randint(len(params), (1,), generator=g))].requires_grad_(False)


def unfreeze(model: nn.Module, g: torch.Generator) -> None:
    for p in model.parameters():
        p.requires_grad_(True)


def replace_head(model: nn.Module, g: torch.Generator) -> None:
    old = model.head if isinstance(model.head, nn.Linear) else model.head[-1]
    head = nn.Sequential(nn.Linear(D, 2 * D), nn.Tanh(), nn.Linear(2 * D, old.out_features))
    reinit(head.to(old.weight.dtype), g)  # float64, or float32 under autocast
    model.head = head


def add_block(model: nn.Module, g: torch.Generator) -> None:
    block = Wrap(nn.Linear(D, D), "tanh")
    reinit(block.to(next(model.parameters()).dtype), g)
    model.neck.append(block)


def del_block(model: nn.Module, g: torch.Generator) -> None:
    if len(model.neck):
        del model.neck[int(torch.randint(len(model.neck), (1,), generator=g))]


def mode(model: nn.Module, g: torch.Generator) -> None:
    """Switch the model between training and eval mode (its dropout, its norms)."""
    model.train(not model.training)


def mix_on(model: nn.Module) -> None:
    """Switch batch-flip mixup on (``Net.mix``), as a training loop sets a flag after a warm-up
    (``sched:mix_on``, drawn by :func:`~fuzz.case.draw_case`)."""
    model.mix = True


def padding_mode(model: nn.Module, g: torch.Generator) -> None:
    model.stem.conv.padding_mode = "reflect"


def reregister(model: nn.Module, g: torch.Generator) -> None:
    head = model.head if isinstance(model.head, nn.Linear) else model.head[-1]
    weight = head.weight
    del head.weight
    head.weight = weight  # now after the bias in named_parameters


def bias_none(model: nn.Module, g: torch.Generator) -> None:
    (model.head if isinstance(model.head, nn.Linear) else model.head[-1]).bias = None


def step(model: nn.Module, g: torch.Generator) -> None:
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g, dtype=p.dtype))


def copy_after(model: nn.Module, g: torch.Generator) -> None:
    """A frozen deep copy of the model, made after ``make_per_sample`` (an EMA teacher), whose
    head the forward adds on its features (kept in a list: not a registered module)."""
    values = [v for m in model.modules() for v in vars(m).values()]
    values += [t for v in values if isinstance(v, list | tuple) for t in v]
    kept = {id(v): None for v in values if torch.is_tensor(v) and not v.is_leaf}  # activations
    copied = copy.deepcopy(model, kept)
    for p in copied.parameters():  # a scripted block's copies are no leaves (its head's are)
        p.requires_grad_(not p.is_leaf and p.requires_grad)
    model.copied = [copied]


_KIND = {
    "tie_after": tie_after,
    "param_hook": param_hook,
    "fwd_hook": fwd_hook,
    "freeze": freeze,
    "unfreeze": unfreeze,
    "replace_head": replace_head,
    "add_block": add_block,
    "del_block": del_block,
    "step": step,
    "mode": mode,
    "padding_mode": padding_mode,
    "reregister": reregister,
    "bias_none": bias_none,
    "copy_after": copy_after,
}


def change(kind: str, seed: int) -> Change:
    """The change ``kind``, drawing from ``seed``."""
    return lambda model: _KIND[kind](model, torch.Generator().manual_seed(seed))


def schedule(draw, calls: int, lm: bool) -> list[list[Change]]:
    """The changes before each call (those before call 0 come after ``make_per_sample``)."""
    out: list[list[Change]] = [[] for _ in range(calls)]
    if draw.chance("sched:tie_after", 0.1):
        out[draw.int(0, calls - 1)].append(change("tie_after", draw.rng.getrandbits(30)))
    for kind in ("param_hook", "fwd_hook"):
        if draw.chance(f"sched:{kind}", 0.1):
            out[draw.int(0, calls - 1)].append(change(kind, draw.rng.getrandbits(30)))
    for k in range(1, calls):
        for kind in ("freeze", "unfreeze", "replace_head", "add_block", "step", "mode"):
            if lm and kind in ("replace_head", "add_block"):
                continue
            if draw.chance(f"sched:{kind}", 0.06):
                out[k].append(change(kind, draw.rng.getrandbits(30)))
    return out
