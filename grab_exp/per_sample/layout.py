"""Where the batch is in each tensor a layer takes and returns, probed from the model itself.

A per-layer rule assumes that the batch is dimension 0 of the layer's input and output. That
fails silently where a model puts it elsewhere (sequence-first ``(T, B, D)`` activations) or
nowhere (a position embedding of ``arange(T)``): with ``T == B`` the shapes even fit. So the
hook path probes the model once: two forwards, of the batch's first example twice and three
times, record every hooked call's tensors. A tensor's batch dimension is the one dimension whose
size goes from 2 to 3 (not 1 to 2: a model may squeeze a batch of one); a tensor whose shape
does not change has none (it does
not depend on the batch). Any other change (the batch merged with another dimension, a shape
that depends on the batch size some other way) cannot be read by a rule and is refused.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

__all__ = ["CallLayout", "batch_dim", "expand_over_batch", "shape_of"]

#: per leaf: its shape, or ``None`` for a leaf that is not a tensor
Shapes = tuple[torch.Size | None, ...]


def shape_of(leaves: list[Any]) -> Shapes:
    """Each leaf's shape (``None`` for a non-tensor)."""
    return tuple(leaf.shape if isinstance(leaf, torch.Tensor) else None for leaf in leaves)


def batch_dim(one: torch.Size | None, two: torch.Size | None) -> int | None:
    """The batch dimension of a tensor whose shape was ``one`` for two examples and ``two`` for
    three; ``None`` when it has none (the same shape, or not a tensor).

    Raises:
        ValueError: the shapes differ other than by one dimension going from 1 to 2 (the message
            is completed by the caller, which names the layer).
    """
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
    """The batch dimension of every leaf of one call of a layer (``None``: no batch dimension).

    Attributes:
        inputs: per leaf of ``(args, kwargs)``.
        outputs: per leaf of the returned value.
    """

    inputs: tuple[int | None, ...]
    outputs: tuple[int | None, ...]

    @classmethod
    def probed(cls, one: tuple[Shapes, Shapes], two: tuple[Shapes, Shapes]) -> CallLayout:
        """From the ``(input, output)`` shapes of the same call at two examples and at three."""
        if len(one[0]) != len(two[0]) or len(one[1]) != len(two[1]):
            raise ValueError("takes or returns a different structure for two examples and three")
        inputs = tuple(batch_dim(a, b) for a, b in zip(one[0], two[0], strict=True))
        outputs = tuple(batch_dim(a, b) for a, b in zip(one[1], two[1], strict=True))
        return cls(inputs, outputs)

    @property
    def batched(self) -> bool:
        """Whether any input carries the batch."""
        return any(d is not None for d in self.inputs)


def expand_over_batch(args: tuple[Any, ...], batch: int) -> tuple[Any, ...]:
    """``args`` with every tensor given the batch as dimension 0: a leading dimension of size 1
    is expanded to ``batch``, otherwise one is prepended (``(T,) -> (batch, T)``).

    For a layer whose input does not depend on the batch (a position embedding of ``arange(T)``):
    its output, then shared by every example, becomes one copy per example, so the gradient at
    the output, and so the layer's per-sample gradients, are per example. Broadcasting against
    the batch downstream gives the same values as before; the first call's check against a
    per-example computation confirms it for the model at hand.
    """

    def expanded(arg: Any) -> Any:
        if not isinstance(arg, torch.Tensor):
            return arg
        if arg.dim() > 0 and arg.shape[0] == 1:
            return arg.expand(batch, *arg.shape[1:])
        return arg.unsqueeze(0).expand(batch, *arg.shape)

    return tuple(expanded(arg) for arg in args)


@dataclass
class Call:
    """One call of a hooked layer in a batch forward, as the hook path keeps it.

    Attributes:
        leaves: the leaves of ``(args, kwargs)``, tensors detached.
        spec: their pytree structure (``tree_unflatten(leaves, spec)`` gives ``(args, kwargs)``).
        outputs: the output's leaves (tensors as returned, for their gradients).
        grads: per output leaf, the gradient of the batch-mean loss at it (``None``: the leaf
            did not reach the loss, or is not a tensor).
        sources: the autograd nodes that made the call's tensor inputs (a walk of the graph
            steps over the call from its outputs to them).
        versions: each output tensor's ``_version`` when returned (an in-place change shows).
        input_versions: per leaf of ``(args, kwargs)``, its tensor's ``_version`` when the call
            began (``None`` for a non-tensor), kept for a layer that is replayed.
        edges: per output leaf, where its gradient is taken (a
            :class:`~torch.autograd.graph.GradientEdge`; ``None`` where it has none), kept when
            the call is recorded for a backward.
        in_place: whether an output was changed in place by the end of the forward and loss
            (:meth:`changed` then, as the hook path reads it once per call).
    """

    leaves: list[Any]
    spec: Any
    outputs: list[Any]
    grads: list[torch.Tensor | None]
    sources: list[Any] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    edges: list[Any] = field(default_factory=list)
    input_versions: list[int | None] = field(default_factory=list)
    in_place: bool = False

    def input_changed(self) -> bool:
        """Whether an input tensor was changed in place since the call began (the saved leaves
        share their tensors' version counters)."""
        return any(
            v is not None and t._version != v
            for t, v in zip(self.leaves, self.input_versions, strict=False)
        )

    def changed(self) -> bool:
        """Whether an output was changed in place since the call returned it."""
        return any(
            isinstance(t, torch.Tensor) and t._version != v
            for t, v in zip(self.outputs, self.versions, strict=False)
        )


# ------------------------------------------------------------ a batch's inputs and outputs
#: a batch's inputs: one tensor, or a tuple/list of positional or a dict of keyword tensors, each
#: with the batch in dimension 0
Inputs = Any


def call_model(model: Any, x: Inputs) -> Any:
    """``model(x)``, ``model(*x)`` for a tuple or list, ``model(**x)`` for a dict (HF style)."""
    if isinstance(x, dict):
        return model(**x)
    if isinstance(x, tuple | list):
        return model(*x)
    return model(x)


def batch_size(x: Inputs) -> int:
    """``B``: dimension 0 of the inputs' first tensor.

    Raises:
        ValueError: the inputs hold no tensor with a dimension, or tensors of different ``B``.
    """
    if isinstance(x, torch.Tensor) and x.dim():  # the usual input: no pytree to walk
        return x.shape[0]
    sizes = {t.shape[0] for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor) and t.dim()}
    if len(sizes) != 1:
        raise ValueError(
            f"per-sample inputs: got tensors with batch sizes {sorted(sizes)}; allowed: a tensor, "
            "or a tuple or dict of tensors, all with the batch in dimension 0"
        )
    return sizes.pop()


def take(x: Inputs, index: torch.Tensor | list[int]) -> Inputs:
    """The examples ``index`` of the inputs or targets (every tensor indexed along dimension 0;
    a tuple or dict of them, such as ``(labels, weights)`` targets, leaf by leaf)."""
    return tree_map(lambda t: t[index] if isinstance(t, torch.Tensor) and t.dim() else t, x)


def narrow(x: Inputs, start: int, length: int) -> Inputs:
    """The examples ``start .. start + length`` of the inputs or targets (a view of every
    tensor along dimension 0; a tuple or dict of them leaf by leaf)."""
    if isinstance(x, torch.Tensor):  # the usual targets: no pytree to walk
        return x.narrow(0, start, length)
    return tree_map(
        lambda t: t.narrow(0, start, length) if isinstance(t, torch.Tensor) and t.dim() else t, x
    )


def input_shapes(x: Inputs) -> tuple:
    """The inputs' structure, shapes, dtypes and plain values (flags): a structure key, equal
    for batches of one kind."""
    if isinstance(x, torch.Tensor):  # the usual input: no pytree to walk
        return (x.shape, x.dtype)
    leaves, spec = tree_flatten(x)
    values = tuple(t if isinstance(t, bool | int | float | str | None) else None for t in leaves)
    dtypes = tuple(getattr(t, "dtype", None) for t in leaves)
    return (str(spec), shape_of(leaves), dtypes, values)


@dataclass(frozen=True)
class OutputLayout:
    """Where each tensor leaf of a model's output has the batch (``None``: not a tensor).

    Attributes:
        dims: per output leaf, its batch dimension.
        spec: the output's pytree structure.
    """

    dims: tuple[int | None, ...]
    spec: Any

    @classmethod
    def probed(cls, two: Any, three: Any) -> OutputLayout:
        """From the model's outputs for two and for three examples. A tensor leaf whose shape
        does not change has no batch dimension: it is the same for every example (a term of
        the parameters alone, such as a Bayesian layer's KL); one that is a value of the whole
        batch instead shows in the check's mixing test.

        Raises:
            ValueError: a leaf whose shapes differ other than in one dimension from 2 to 3.
        """
        leaves, spec = tree_flatten(two)
        shapes = zip(shape_of(leaves), shape_of(tree_flatten(three)[0]), strict=True)
        return cls(tuple(batch_dim(a, b) for a, b in shapes), spec)

    def apply(self, out: Any, fn: Callable[[torch.Tensor, int], torch.Tensor]) -> Any:
        """``out`` with ``fn(leaf, its batch dimension)`` in place of every batched leaf."""
        leaves = tree_flatten(out)[0]
        mapped = [t if d is None else fn(t, d) for t, d in zip(leaves, self.dims, strict=True)]
        return tree_unflatten(mapped, self.spec)

    def select(self, out: Any, index: torch.Tensor) -> Any:
        """The output of examples ``index`` (each batched leaf along its batch dimension)."""
        return self.apply(out, lambda t, d: t.index_select(d, index))

    def narrow(self, out: Any, start: int, length: int) -> Any:
        """The output of examples ``start .. start + length`` (each leaf along its dimension)."""
        if isinstance(out, torch.Tensor):  # the usual output: one tensor, no pytree to walk
            return out if self.dims[0] is None else out.narrow(self.dims[0], start, length)
        return self.apply(out, lambda t, d: t.narrow(d, start, length))
