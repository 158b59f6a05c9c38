"""Where the batch is in each tensor a layer takes and returns (sequence-first ``(T, B, D)``,
nowhere for a position embedding of ``arange(T)``), probed from the batch's first example run
twice and three times: the batch dimension goes from 2 to 3 (a batch of one may be squeezed)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from grab_exp.devices import in_graph_safe
from grab_exp.per_sample.modules import UnsupportedModelError

__all__ = ["Call", "CallLayout", "OutputLayout", "call_model", "expand_over_batch", "take"]

#: per leaf: its shape, or ``None`` for a leaf that is not a tensor
Shapes = tuple[torch.Size | None, ...]


def shape_of(leaves: list[Any]) -> Shapes:
    return tuple(leaf.shape if isinstance(leaf, torch.Tensor) else None for leaf in leaves)


def batch_dim(one: torch.Size | None, two: torch.Size | None) -> int | None:
    """The batch dimension of a tensor of shape ``one`` for two examples and ``two`` for three
    (``None``: none); ``ValueError`` (completed by the caller) for any other change."""
    if one is None or one == two:
        return None
    diff = [k for k, (a, b) in enumerate(zip(one, two, strict=False)) if a != b]
    if len(one) == len(two) and len(diff) == 1 and (one[diff[0]], two[diff[0]]) == (2, 3):
        return diff[0]
    raise ValueError(
        f"has a tensor of shape {tuple(one)} for two examples and {tuple(two)} for three: its "
        "batch is not one dimension of its own"
    )


@dataclass(frozen=True)
class CallLayout:
    """The batch dimension (or ``None``) of every leaf of a call's ``(args, kwargs)`` and output."""

    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]

    @classmethod
    def probed(cls, one: tuple[Shapes, Shapes], two: tuple[Shapes, Shapes]) -> CallLayout:
        if len(one[0]) != len(two[0]) or len(one[1]) != len(two[1]):
            raise ValueError("takes or returns a different structure for two examples and three")
        return cls(tuple(map(batch_dim, one[0], two[0])), tuple(map(batch_dim, one[1], two[1])))


def expand_over_batch(args: Any, batch: int) -> Any:
    """``args`` (a pytree) with every tensor given the batch as dimension 0 (a leading 1 expanded,
    else one prepended): a position embedding then returns one copy, and output gradient, per
    example."""

    def expanded(arg: Any) -> Any:
        one = arg if arg.dim() > 0 and arg.shape[0] == 1 else arg.unsqueeze(0)  # (1, ...)
        return one.expand(batch, *one.shape[1:])

    return tree_map(lambda t: expanded(t) if isinstance(t, torch.Tensor) else t, args)


@dataclass
class Call:
    """One call of a hooked layer in a batch forward: the leaves of ``(args, kwargs)`` (detached)
    and their ``spec``, the output's leaves as returned and their ``grads``, ``versions`` and
    ``edges``, the nodes that made its inputs (``sources``), a replayed call's inputs and their
    versions as it entered (``input_versions``), whether an output changed ``in_place``; a
    rule's weight copied per example (``weight_copies``: its gradient, then its edge); a replayed
    call's buffers as it entered (``entry_buffers``: name, tensor, version) and their values,
    where they changed since (``buffers``, by name); the numbers of the calls open when it ran, its
    own last (``nesting``)."""

    leaves: list[Any]
    spec: Any
    outputs: list[Any]
    grads: list[torch.Tensor | None]
    sources: list[Any] = field(default_factory=list)
    versions: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    edges: list[Any] = field(default_factory=list)
    input_versions: list[tuple[torch.Tensor, int]] = field(default_factory=list)
    in_place: bool = False
    weight_copies: list[Any] = field(default_factory=list)
    buffers: dict[str, torch.Tensor] = field(default_factory=dict)
    entry_buffers: list[tuple[str, torch.Tensor, int]] = field(default_factory=list)
    nesting: tuple[int, ...] = ()


def moved(versions: list[tuple[torch.Tensor, int]]) -> bool:
    """Whether a tensor's version is not the one recorded with it."""
    return any(version(t) != v for t, v in versions)


def version(t: torch.Tensor) -> int:
    """``t``'s version; ``-1`` for an inference tensor (made under ``torch.inference_mode``: a
    statistic a model keeps), which keeps none: only its values tell a change."""
    return -1 if t.is_inference() else t._version


#: a batch's inputs: one tensor (or a list, one argument), a tuple (positional) or dict (keyword)
Inputs = Any


def call_model(model: Any, x: Inputs) -> Any:
    """``model(x)`` (a list too), ``model(*x)`` for a tuple, ``model(**x)`` for a dict (HF)."""
    if isinstance(x, dict):
        return model(**x)
    return model(*x) if isinstance(x, tuple) else model(x)


def batch_size(x: Inputs, what: str = "inputs") -> int:
    if isinstance(x, torch.Tensor) and x.dim():  # the usual input: no pytree to walk
        return x.shape[0]
    sizes = {t.shape[0] for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor) and t.dim()}
    if len(sizes) != 1:
        padded = " (one tensor per example: pad them into one, pad_sequence)" * (len(sizes) > 1)
        raise ValueError(
            f"per-sample {what}: got tensors with batch sizes {sorted(sizes)}; allowed: a tensor, "
            f"or a tuple or dict of tensors, all with the batch in dimension 0{padded}"
        )
    return sizes.pop()


def check_batch(x: Inputs, y: Any) -> None:
    """Refuse, before any work, inputs and targets without one batch in dimension 0, and a call
    under ``torch.inference_mode()``."""
    examples, targets = batch_size(x), batch_size(y, "targets")
    if examples != targets or examples == 0:
        raise ValueError(
            f"per-sample inputs of {examples} examples (dimension 0) and targets of {targets}; "
            "allowed: a batch of one example or more in dimension 0 of every tensor (a "
            "sequence-first (T, B) input: move its batch first, e.g. x.transpose(0, 1))"
        )
    if torch.is_inference_mode_enabled():  # its tensors can never get a gradient
        raise ValueError("per-sample gradients under torch.inference_mode(): call outside it")
    for where, value in (("an input", x), ("the targets", y)):
        if any(isinstance(t, torch.Tensor) and t.is_inference() for t in tree_flatten(value)[0]):
            raise ValueError(
                f"per-sample {where}: a tensor made under torch.inference_mode(), which autograd "
                "cannot save for backward (a plain step raises too); make it outside inference "
                "mode, or clone it outside (t.clone())"
            )


class SeenInputs:
    """A call's inputs and targets as it found them: each tensor's version, storage and values,
    each dict's and list's items, an object's attributes, read again by :meth:`changed` (a model
    or loss that changes what it is given in place, ``x /= 2``, ``y -= 1``, ``extras.pop("m")``,
    ``extras.calls += 1``, or behind torch's back, ``x.data = x.data / 2``, numpy's ``out=``,
    changes it again on each of a method's forwards, where a plain step changes it once);
    ``values``: whether values are kept (not with the checks off, nor inside a captured step:
    versions and storage only)."""

    def __init__(self, x: Inputs, y: Any, values: bool = True) -> None:
        self.seen: list[tuple[str, Any, Any, Any]] = []  # (where, object, what it held, values)
        self._values = values and not in_graph_safe()
        self._walk("x", x)
        self._walk("y", y)

    def _walk(self, where: str, value: Any) -> None:
        if isinstance(value, torch.Tensor | dict | list) or _plain_object(value):  # not a tuple
            kept = self._values and isinstance(value, torch.Tensor) and _dense(value)
            copy = value.detach().clone() if kept else None
            self.seen.append((where, value, _held(value), copy))
        if isinstance(value, dict | list | tuple):
            for key, item in value.items() if isinstance(value, dict) else enumerate(value):
                self._walk(f"{where}[{key!r}]", item)
        elif _plain_object(value):  # its tensors; its containers only as attributes
            for name, item in vars(value).items():
                if isinstance(item, torch.Tensor):
                    self._walk(f"{where}.{name}", item)

    def changed(self, read: bool = True) -> str | None:
        """The first input (``x[...]``) or target (``y``) changed in place since, or ``None``;
        ``read=False``: values off the CPU are not compared (a host read)."""
        for where, value, held, copy in self.seen:
            if (now := _held(value)) != held:
                if _plain_object(value):  # the attribute
                    where += f".{next(k for k, _ in sorted(set(now) ^ set(held)))}"
                return where
            compared = copy is not None and (read or copy.device.type == "cpu")
            if compared and not torch.equal(_bits(copy), _bits(value)):
                return where
        return None


#: integers as wide as a float's elements: values compared bit for bit (NaN equals NaN)
INTS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    t = torch.view_as_real(t) if t.is_complex() else t
    return t.view(INTS[t.element_size()]) if t.is_floating_point() else t


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t`` has one strided storage (its pointer and values can be read)."""
    return t.layout == torch.strided and not t.is_nested


def _held(value: Any) -> Any:
    """A tensor's version and storage, or a dict's or list's keys (an object's attributes) and
    their items' identities."""
    if isinstance(value, torch.Tensor):
        return (value._version, value.data_ptr(), value.shape) if _dense(value) else value._version
    items = vars(value) if _plain_object(value) else value
    return [(k, id(v)) for k, v in (items.items() if isinstance(items, dict) else enumerate(items))]


def _plain_object(value: Any) -> bool:
    """Whether ``value`` is an object with attributes of its own passed as an input (a count kept
    on it: ``extras.calls += 1``), not a tensor, module, container, function or class."""
    return hasattr(value, "__dict__") and not isinstance(
        value, torch.Tensor | nn.Module | dict | list | tuple | type | Callable
    )


def listed_values(x: Inputs, batch: int) -> str | None:
    """Where a failing call's cause may be per-example values the methods cannot split: an input
    (a dict's key, a tuple's position) that is a list or tuple of ``batch`` items (``B >= 2``),
    passed whole to each example alone, as every method passes a value that is not a tensor."""
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, tuple) else ()
    for key, value in items:
        if batch >= 2 and isinstance(value, list | tuple) and len(value) == batch:
            return (
                f"x[{key!r}] is a {type(value).__name__} of {batch} items, as many as the batch's "
                "examples: every method splits tensors by example and passes other values whole "
                "to each example alone; give per-example values as a tensor (ids, lengths)"
            )
    return None


def _floating(t: Any) -> bool:
    return torch.is_tensor(t) and t.is_floating_point()


def _opaque(t: Any) -> bool:
    return not torch.is_tensor(t) and not isinstance(t, bool | int | float | complex | str | None)


def take(x: Inputs, index: torch.Tensor | list[int] | slice) -> Inputs:
    """The examples ``index`` of the inputs or targets (every tensor indexed along dimension 0;
    a tuple or dict of them, such as ``(labels, weights)`` targets, leaf by leaf)."""
    if isinstance(x, torch.Tensor) and x.dim():  # the usual targets: no pytree to walk
        return x[index]
    return tree_map(lambda t: t[index] if isinstance(t, torch.Tensor) and t.dim() else t, x)


def input_shapes(x: Inputs) -> tuple:
    """The inputs' structure, shapes, dtypes and plain values: the key of a kind of batch."""
    if isinstance(x, torch.Tensor):  # the usual input: no pytree to walk
        return (x.shape, x.dtype)
    leaves, spec = tree_flatten(x)
    values = tuple(t if isinstance(t, bool | int | float | str | None) else None for t in leaves)
    return (str(spec), shape_of(leaves), tuple(getattr(t, "dtype", None) for t in leaves), values)


@dataclass(frozen=True)
class OutputLayout:
    """Where each leaf of a model's output (pytree ``spec``) has the batch (``None``: nowhere)."""

    dims: tuple[int | None, ...]
    spec: Any

    @classmethod
    def probed(cls, two: Any, three: Any, advice: str = "") -> OutputLayout:
        """From the model's outputs for two and three examples (a leaf of the same shape is the
        same for every example, as a Bayesian layer's KL); its refusal ends with ``advice``."""
        leaves, spec = tree_flatten(two)
        others = tree_flatten(three)[0]
        if len(leaves) != len(others):
            raise UnsupportedModelError(
                f"the model's output has {len(leaves)} leaves for two examples and {len(others)} "
                "for three (a list of per-example tensors?): the batch must be a dimension of "
                f"its tensors (torch.stack them){advice}"
            )
        shapes = zip(shape_of(leaves), shape_of(others), strict=True)
        try:
            return cls(tuple(batch_dim(a, b) for a, b in shapes), spec)
        except ValueError as error:
            raise UnsupportedModelError(f"the model's output {error}{advice}") from None

    def check_batch(self, out: Any, batch: int) -> None:
        """Refuse an output without ``batch`` examples where the probe found the batch, or with
        another number of leaves than the probe's."""
        leaves = [out] if isinstance(out, torch.Tensor) else tree_flatten(out)[0]
        if len(leaves) != len(self.dims):
            raise UnsupportedModelError(
                f"the model's output has {len(leaves)} leaves for this batch and {len(self.dims)} "
                "in the probe of its kind of batch; use method=loop (auto takes it)"
            )
        for t, d in zip(leaves, self.dims, strict=True):
            if d is not None and torch.is_tensor(t) and (t.dim() <= d or t.shape[d] != batch):
                raise UnsupportedModelError(
                    f"the model's output of shape {tuple(t.shape)} for {batch} example(s) has no "
                    f"batch in dimension {d}, where its probe found it (a .squeeze() that drops a "
                    "batch of one?); use method=loop (auto takes it)"
                )

    def unbatched(self, out: Any) -> bool:
        """Whether ``out`` has a floating leaf without a batch dimension (a value of the batch),
        or a leaf the pytree does not open (a dataclass: what it holds cannot be split)."""
        leaves = zip(tree_flatten(out)[0], self.dims, strict=True)
        return any(d is None and (_floating(t) or _opaque(t)) for t, d in leaves)

    def apply(self, out: Any, fn: Callable[[torch.Tensor, int], torch.Tensor]) -> Any:
        """``out`` with ``fn(leaf, its batch dimension)`` in place of every batched leaf."""
        leaves = tree_flatten(out)[0]
        mapped = [t if d is None else fn(t, d) for t, d in zip(leaves, self.dims, strict=True)]
        return tree_unflatten(mapped, self.spec)

    def select(self, out: Any, index: torch.Tensor) -> Any:
        return self.apply(out, lambda t, d: t.index_select(d, index))

    def narrow(self, out: Any, start: int, length: int) -> Any:
        if isinstance(out, torch.Tensor):  # the usual output: one tensor, no pytree to walk
            return out if self.dims[0] is None else out.narrow(self.dims[0], start, length)
        return self.apply(out, lambda t, d: t.narrow(d, start, length))
