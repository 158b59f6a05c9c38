"""The hook path's record of a forward and its one ``loss.backward()`` (:class:`Recorder`)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import get_gradient_edge as _edge  # where autograd takes its gradient
from torch.nn.modules.module import _global_forward_hooks
from torch.nn.utils.rnn import PackedSequence
from torch.utils._pytree import tree_flatten, tree_unflatten

from grab_exp.per_sample.check.tolerance import autocast_on
from grab_exp.per_sample.layout import Call, expand_over_batch, moved, version
from grab_exp.per_sample.modules import CHECKPOINT_REFUSAL, UnsupportedModelError
from grab_exp.per_sample.plan import Layers
from grab_exp.per_sample.rules.base import OWN_IDS


class OwnHook:
    """One of the hook path's hooks on ``layer``, idle on any other module (a shallow copy of the
    model shares ``layer``'s hook registries) and copied or pickled as :class:`IdleHook` (a deep
    copy of the model made after ``make_per_sample``, an EMA teacher, carries them: its calls were
    recorded as ``layer``'s; ``torch.save(model)`` failed on the closures)."""

    def __init__(self, fn: Any, layer: nn.Module) -> None:
        self.fn, self.layer = fn, layer

    def __call__(self, module: nn.Module, *args: Any) -> Any:
        return self.fn(module, *args) if module is self.layer else None

    def __reduce__(self) -> tuple:
        return IdleHook, ()


class IdleHook:
    """A copied :class:`OwnHook`: does nothing."""

    def __call__(self, *args: Any) -> None:
        return None


class Recorder:
    """The layers' hooks and, in ``mode`` ``record`` or ``probe`` (``idle``: any other forward),
    each layer's ``calls``; the ``expanded`` layers' inputs get ``batch``."""

    def __init__(self, layers: Layers) -> None:
        self.layers, self.mode, self.batch = layers, "idle", 0
        self.calls: dict[str, list[Call]] = {}
        self.expanded: set[str] = set()
        self.entry_buffers: dict[str, list[list]] = {}  # replayed calls' entries (_entry_hook)
        self.updating: set[str] = set()  # replayed layers whose buffers a probe saw change

    @contextlib.contextmanager
    def in_mode(self, mode: str) -> Iterator[None]:
        before, self.mode, self.copies, self.entry_buffers = self.mode, mode, {}, {}
        self.entered, self.open = 0, []  # calls entered; the numbers of those not returned yet
        undo = [] if mode != "record" or autocast_on() else self._copy_weights()
        try:
            yield
        finally:
            self.mode = before
            for put_back in undo:
                put_back()

    def _copy_weights(self) -> list[Any]:
        """Each rule layer that copies its weight per example (``LayerRule.copy_weight``), which
        its forward keeps in ``copies`` for its call; the ``undo``s."""
        undo = [
            rule.copy_weight(self.layers.modules[n], functools.partial(self.copies.__setitem__, n))
            for n, rule in self.layers.rules.items()
            if rule.copy_weight is not None
        ]
        return [u for u in undo if u is not None]

    def hook(self, name: str, layer: nn.Module, replayed: bool) -> list[Any]:
        """Hook ``layer`` (``replayed``: a fallback's, whose replay reads its inputs)."""
        forward = OwnHook(self._forward_hook(name, replayed), layer)
        pre, entry = (
            OwnHook(self._pre_hook(name, replayed), layer),
            OwnHook(self._entry_hook(name), layer),
        )
        handles = [
            layer.register_forward_hook(forward, with_kwargs=True),
            layer.register_forward_pre_hook(pre, with_kwargs=True),
        ]
        if replayed:  # a rule reads the call's own inputs and outputs: no entry to note
            handles.append(layer.register_forward_pre_hook(entry, prepend=True, with_kwargs=True))
        OWN_IDS.update(handle.id for handle in handles)
        return handles

    def _entry_hook(self, name: str):
        """A replayed layer's call as it enters, before any pre-hook of the layer (the old
        ``spectral_norm``'s power iteration): its buffers, their versions and their values where
        a probe saw them change during or after a call (its replay starts there), and its input
        tensors (a pre-hook of the user's that changes them would run again in the replay)."""

        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if not self._idle():
                named = list(module.named_buffers())
                kept = self.mode == "record" and name in self.updating
                values = {n: b.clone() for n, b in named} if kept else {}
                versions = [(n, b, version(b)) for n, b in named]
                inputs = [(t, version(t)) for t in _tensors(args, kwargs)]
                self.entry_buffers.setdefault(name, []).append([versions, values, inputs])

        return hook

    def _pre_hook(self, name: str, replayed: bool):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            if self._idle():
                return None
            self.entered += 1
            self.open.append(self.entered)
            if replayed:  # the user's pre-hooks before this one left the inputs as they entered
                self._same_inputs(name, args, kwargs)
            changed = name in self.expanded
            if changed:  # keyword arguments too: pos(input=torch.arange(T))
                args, kwargs = expand_over_batch((args, kwargs), self.batch)
            return (args, kwargs) if changed else None

        return hook

    def _idle(self) -> bool:
        """Whether a layer's call is not recorded: idle, or under ``torch.inference_mode()`` (a
        constant computed in the forward: no gradient, and its tensors have no version)."""
        return self.mode == "idle" or torch.is_inference_mode_enabled()

    def _forward_hook(self, name: str, replayed: bool):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if self._idle():
                return None
            if torch._C._functorch.maybe_current_level() is not None:  # a slice of its input
                raise UnsupportedModelError(f"{self.layers.label(name)}: {TRANSFORMED}")
            self._refuse_swapped(name)
            if args and isinstance(args[0], PackedSequence):  # an RNN's: examples interleaved
                raise UnsupportedModelError(f"{self.layers.label(name)}: {PACKED}")
            plain = not kwargs and isinstance(output, torch.Tensor)
            if plain and all(isinstance(a, torch.Tensor) for a in args):
                leaves, spec = list(args), _args_spec(len(args))  # the usual call: no pytree
                outputs, output_spec = [output], None
            else:
                leaves, spec = tree_flatten((list(args), kwargs))
                outputs, output_spec = tree_flatten(output)
            sources = [t.grad_fn for t in leaves if isinstance(t, torch.Tensor) and t.grad_fn]
            leaves = [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves]
            graded = [isinstance(t, torch.Tensor) and t.requires_grad for t in outputs]
            # an output may be computed from another one inside the layer (h, then z = f(h)):
            # views of them take only the gradients from outside, so no path counts twice
            alias = self.mode == "record" and replayed and sum(graded) > 1
            if alias:
                outputs = [t.view_as(t) if g else t for t, g in zip(outputs, graded, strict=True)]
            call = Call(leaves, spec, outputs, [None] * len(outputs), sources)
            call.nesting = tuple(self.open)  # its own number last, then it returns
            self.open.pop()
            call.versions = [(t, version(t)) for t in outputs if isinstance(t, torch.Tensor)]
            if self.mode == "record":
                call.edges = [_edge(t) if g else None for t, g in zip(outputs, graded, strict=True)]
                copies = self.copies.pop(name, None)
                if copies is not None and copies.grad_fn is not None:
                    call.weight_copies = [None, _edge(copies)]
            if replayed:  # its replay reads its inputs: as they entered (_same_inputs)
                entry = self.entry_buffers[name].pop()
                call.entry_buffers, call.buffers, call.input_versions = entry
            self.calls.setdefault(name, []).append(call)
            return tree_unflatten(outputs, output_spec) if alias else None

        return hook

    def _refuse_swapped(self, name: str) -> None:
        """Refuse a call that read another tensor than a parameter of the layer's (its rows would
        be that tensor's gradient, filed under the parameter)."""
        swapped = [n for m, n, p in self.layers.slots[name] if m._parameters.get(n) is not p]
        if swapped:
            raise UnsupportedModelError(
                f"{self.layers.label(name)}: its {swapped[0]} was not its registered Parameter "
                "during its call (torch.func.functional_call or another swap of the module's "
                "tensors): the hook path's rows would be the gradient of the tensor it read, "
                "filed under the parameter; use method=func (auto does)"
            )

    def _same_inputs(self, name: str, args: tuple, kwargs: dict) -> None:
        """Refuse a replayed layer whose input tensors are not those its call entered with, as
        they were (a pre-hook of the user's, which runs between, returned or changed them)."""
        noted, now = self.entry_buffers[name][-1][2], _tensors(args, kwargs)
        if len(now) != len(noted) or any(
            t is not n or moved([(n, v)]) for t, (n, v) in zip(now, noted, strict=False)
        ):
            raise UnsupportedModelError(
                f"{self.layers.label(name)}: a forward pre-hook of the user's changes its input, "
                "and the per-layer replay of the layer (it has no rule) would run the hook again "
                "on the changed input; use method=func (auto does)"
            )

    def settle_buffers(self, calls: dict[str, list[Call]]) -> None:
        """After a forward: the replayed calls whose buffers changed since they entered (in place
        or set anew; by the layer, its parent or another layer) keep the values they found, which
        a probe learns to keep; refused where a recorded call's changed unkept."""
        for name, layer_calls in calls.items():
            layer = self.layers.modules[name]
            for call in layer_calls:
                if not (changed := [n for n, b, v in call.entry_buffers if _moved(layer, n, b, v)]):
                    call.buffers = {}  # the replay reads them as they are
                elif self.mode == "probe":
                    self.updating.add(name)
                elif not call.buffers:
                    raise UnsupportedModelError(
                        f"{self.layers.label(name)}: its buffer {changed[0]} changed during or "
                        "after its call (in place or set anew; by its forward, its parent or "
                        "another layer) on this batch, which the probe of its kind of batch did "
                        "not see: the hook path replays the layer from the buffers its call "
                        "found only where the probe saw them change; use method=loop (auto "
                        "takes it)"
                    )

    def read_in_place(self, calls: dict[str, list[Call]]) -> bool:
        """Note each call's in-place change; whether any output changed. Refused: an output view
        changed in place, a replayed layer's input changed in place during or after its call."""
        changed = False
        self.settle_buffers(calls)
        for name, layer_calls in calls.items():
            for call in layer_calls:
                if moved(call.input_versions):  # as it entered
                    raise UnsupportedModelError(
                        f"{self.layers.label(name)}: an input it read was changed in "
                        "place during or after its call (x.relu_() on a tensor it was given): the "
                        "hook path replays the layer on its inputs as they are now; use "
                        "method=func (auto does), or an out-of-place operation"
                    )
                call.in_place = moved(call.versions)
                changed |= call.in_place
                views = [t for t in call.outputs if isinstance(t, torch.Tensor) and t._is_view()]
                if call.in_place and views:
                    raise UnsupportedModelError(
                        f"{self.layers.label(name)}: its output of shape "
                        f"{tuple(views[0].shape)}, a view, was changed in place after the layer "
                        "returned it (an in-place activation or residual add): the hook path "
                        "cannot read its gradient there; use method=func (auto does), or an "
                        "out-of-place operation (x = x + h, not x += h)"
                    )
        return changed

    def refuse_direct_uses(self, loss: torch.Tensor, calls: dict[str, list[Call]]) -> None:
        """Refuse a parameter that ``loss`` reaches other than through its layer's calls (a walk
        of the graph stepping over every recorded call: a penalty weighted 0 is found)."""
        skip = _outer_sources(calls)  # stepped over: each call, from its output to its inputs
        reached = {id(n.variable) for n in _nodes([loss.grad_fn], skip) if hasattr(n, "variable")}
        for name, own in self.layers.own.items():
            if used := [n for n, p in own.items() if id(p) in reached]:
                kids = any(m.startswith(f"{name}.") if name else m for m in self.layers.modules)
                raise UnsupportedModelError(
                    f"{self.layers.label(name)}: the loss reaches {used[0]} other than through "
                    f"this layer's forward ({READ_AROUND_CHILDREN * kids}a weight penalty or a "
                    "center loss in loss_fn, a parent module that reads it): the hook path cannot "
                    "split that part of its gradient between the examples; use method=func (auto "
                    "does), or the optimizer's weight_decay for a plain penalty"
                )

    def backward(self, loss: torch.Tensor, calls: dict[str, list[Call]], retain: bool) -> None:
        """``loss.backward()``, capturing the gradients at the calls' outputs in their ``grads``."""
        handles = [
            edge.node.register_prehook(_capture(slots, k, edge.output_nr))
            for layer_calls in calls.values()
            for call in layer_calls
            for slots, edges in (
                (call.grads, call.edges),
                (call.weight_copies, call.weight_copies[1:]),
            )
            for k, edge in enumerate(edges)
            if edge is not None
        ]
        try:
            if loss.requires_grad:  # else no trainable layer reached the loss
                loss.backward(retain_graph=retain)
        except RuntimeError as error:
            if "Checkpointing is not compatible" in str(error):
                raise UnsupportedModelError(CHECKPOINT_REFUSAL) from error
            raise
        finally:
            for handle in handles:
                handle.remove()


def refuse_foreign_hooks(layers: Layers) -> None:
    """Refuse a global forward hook, or one of the user's on a hooked layer (every call)."""
    if _global_forward_hooks:
        raise UnsupportedModelError(
            "a global forward hook (register_module_forward_hook) can change any layer's "
            "output, which the hook path cannot follow; use method=func (auto does)"
        )
    for name, layer in layers.modules.items():
        hooks = layer._forward_hooks  # one: the path's own (the usual case, read at once)
        if len(hooks) > 1 and not hooks.keys() <= OWN_IDS:
            raise UnsupportedModelError(
                f"{layers.label(name)}: a forward hook of its own can change its output, "
                "which the hook path cannot follow; use method=func (auto does)"
            )
        pre = layer._forward_pre_hooks  # replayed: the entry hook first, the path's own last
        if name in layers.fallbacks and (last := layers.handles[name][1].id) in pre:
            pre.move_to_end(last)  # a user's pre-hook registered since runs before it
        first = next(iter(pre), None)  # its id
        if name in layers.fallbacks and first not in OWN_IDS:
            raise UnsupportedModelError(
                f"{layers.label(name)}: a forward pre-hook registered ahead of the hook "
                "path's own (prepend=True), which the per-layer replay of the layer would run "
                "again and whose changes the path does not see; use method=func (auto does)"
            )


def forward_replaced(layers: Layers) -> bool:
    """Whether a rule layer's ``forward`` was set on the instance, or it left what its rule
    supports (a ``padding_mode`` or ``_conv_forward`` set), since hooked: build them again."""
    pairs = [(r, layers.modules[n]) for n, r in layers.rules.items()]
    return any("forward" in vars(m) or not r.supports(m) for r, m in pairs)


@functools.cache
def _args_spec(count: int) -> Any:
    return tree_flatten(([0] * count, {}))[1]


def _tensors(args: tuple, kwargs: dict) -> list[torch.Tensor]:
    return [t for t in tree_flatten((list(args), kwargs))[0] if isinstance(t, torch.Tensor)]


def _moved(layer: nn.Module, name: str, entered: torch.Tensor, stamp: int) -> bool:
    """Whether ``layer``'s buffer ``name`` is not the tensor it was at a call's entry (of version
    ``stamp``), or moved."""
    try:
        return layer.get_buffer(name) is not entered or version(entered) != stamp
    except AttributeError:  # deleted since
        return True


def _outer_sources(calls: dict[str, list[Call]]) -> dict[Any, list]:
    """Each recorded output's node -> the sources of the calls that returned it, but of the
    outermost only where a layer returns the output of a call made inside its forward (that call's
    sources lie inside the parent's forward, which the parent's replay covers); two calls apart (a
    layer that returns its input, or a child's output computed before it ran) both step on."""
    found: dict[Any, list[Call]] = {}
    for layer_calls in calls.values():
        for call in layer_calls:
            for edge in call.edges:
                if edge is not None:
                    found.setdefault(edge.node, []).append(call)
    return {
        node: [s for call in same if not _within(call, same) for s in call.sources]
        for node, same in found.items()
    }


def _within(call: Call, others: list[Call]) -> bool:
    """Whether ``call`` ran inside the forward of another of ``others`` (entered, not returned)."""
    return any(o is not call and o.nesting[-1] in call.nesting[:-1] for o in others)


def _capture(slots: list, k: int, output_nr: int):
    def hook(grad_outputs: tuple) -> None:  # a node pre-hook
        slots[k] = grad_outputs[output_nr]

    return hook


def _nodes(stack: list, skip: dict | None = None) -> list[Any]:
    """Each node of the graph from ``stack``'s once, stepping from a node in ``skip`` to the
    nodes it names instead (not listed) of its own inputs."""
    seen, found = set(), []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if skip and node in skip:
            stack += skip[node]
            continue
        found.append(node)
        for upstream, _ in node.next_functions:
            stack.append(upstream)
    return found


#: the refusal of a layer called with a PackedSequence (its examples interleaved by time step)
PACKED = (
    "its input is a PackedSequence, whose examples the hook path cannot take apart (they are "
    "interleaved by time step); use method=loop (auto takes it)"
)
#: the refusal of a layer called inside a torch.func transform of the model's own
TRANSFORMED = (
    "it runs inside a torch.func transform of the model's own (torch.vmap), whose inputs the "
    "hook path sees one slice at a time; use method=func (auto takes it) or loop"
)
#: why a parameter its module's forward reads itself is not a hooked layer's (the refusal's cause)
READ_AROUND_CHILDREN = "its forward reads it around its child layers (a CLS token, a position); "
#: nodes of operations that can move items across a batch axis (docs/which-models-work.md)
REINDEXING = {f"{op}Backward0" for op in ("Index", "IndexSelect", "MaskedSelect", "Gather",
    "Take", "IndexPut", "MaskedScatter", "Scatter", "ScatterAdd", "ScatterReduce", "IndexAdd",
    "IndexCopy", "Sort", "Topk", "PackPaddedSequence")}  # fmt: skip
REINDEXED = (
    "the model re-indexes its batch (h[sel], index_select, gather, sort or packing; h[j], "
    "unbind, split, flip or roll along the batch; a (B, B) matrix times it, F.embedding of its "
    "rows) before a layer or its output: the batch axis the probe "
    "found may not hold, or the examples may come back in another order; use method=func or loop"
)


def operations(loss: torch.Tensor) -> tuple[str, ...]:
    """The graph's operations, each as often as it occurs: one switched on between calls
    (``h.flip(0)`` behind a flag or a step counter) makes a new kind of batch, checked in full."""
    return tuple(sorted(type(n).__name__ for n in _nodes([loss.grad_fn])))


def refuse_whole_only(loss: torch.Tensor, out: Any, dims: tuple) -> None:
    """Refuse a loss that reads no output of the examples, only values of the whole batch that
    the model computed (``dims``: the output leaves' batch dimensions): a walk of the loss's
    graph that stops at those values finds no output of the examples."""
    leaves = [(t.grad_fn, d) for t, d in zip(tree_flatten(out)[0], dims, strict=True) if _graded(t)]
    whole = {f for f, d in leaves if d is None}
    if whole and not {f for f, d in leaves if d is not None} & set(
        _nodes([loss.grad_fn], {f: [] for f in whole})  # their graphs not walked
    ):
        raise UnsupportedModelError(INSIDE)


#: the refusal of a loss the model computes over the batch (:func:`operations`)
INSIDE = (
    "the loss reads no output of the examples, only values of the whole batch that the model "
    "computed (HuggingFace's loss from labels=): the hook path cannot check on each call that "
    "it is the mean of the examples' own losses (a token mean over uneven -100 padding is "
    "not); compute the loss in loss_fn from the examples' outputs (out.logits), or use "
    "method=func or loop (auto takes them)"
)


def _graded(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.is_floating_point() and t.grad_fn is not None


def reindexes(calls: dict[str, list[Call]], out: Any, batch: int) -> bool:
    """Whether a :data:`REINDEXING` node, or one taking apart, flipping, rolling or multiplying
    (``P @ h``) an axis of ``batch > 1`` items (the examples may be put back in an order of the
    data's: ``stack([h[j] for j in order])``), is upstream of the layers' inputs or the output."""
    stack = [s for layer_calls in calls.values() for c in layer_calls for s in c.sources]
    stack += [t.grad_fn for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
    return any(_reindexing(node, batch) for node in _nodes(stack))


def _reindexing(node: Any, batch: int) -> bool:
    name = type(node).__name__
    if name == "UnbindBackward0":  # one gradient per item of the axis
        return len(node._input_metadata) == batch > 1
    if name in ("FlipBackward0", "RollBackward0"):  # along the axes of the items
        shape, dims = node._input_metadata[0].shape, node._saved_dims
        return batch > 1 and (not dims or any(shape[_signed(d)] == batch for d in dims))
    if name in ("MmBackward0", "AddmmBackward0"):  # a (B, B) matrix (a permutation's) on either
        first = "self" if name == "MmBackward0" else "mat1"  # side of the batch, not a weight
        sizes = (getattr(node, f"_saved_{first}_sym_sizes"), node._saved_mat2_sym_sizes)
        weight = any(_parameter(fn) for fn, _ in node.next_functions[-2:])  # x @ W.t()
        return batch > 1 and (batch, batch) in sizes and not weight
    if name == "BmmBackward0":  # the same batched (einsum's "ji,jc->ic" with a one-hot matrix)
        operands = [t for t in (node._saved_self, node._saved_mat2) if t is not None]
        return batch > 1 and any(t.shape[-2:] == (batch, batch) for t in operands)
    if name == "EmbeddingBackward0":  # rows of an activation of B rows taken by index
        weight = type(node.next_functions[0][0]).__name__
        return node._saved_weight_sym_argsize_0 == batch > 1 and weight != "AccumulateGrad"
    if name in ("SelectBackward0", "SplitBackward0", "SliceBackward0"):
        whole = name == "SliceBackward0" and (node._saved_start, node._saved_step) == (0, 1)
        items = node._saved_self_sym_sizes[_signed(node._saved_dim)]
        return items == batch > 1 and not (whole and node._saved_end >= items)
    return name in REINDEXING


def _parameter(node: Any) -> bool:
    """Whether an autograd node is a parameter's, through a transpose or a view."""
    while type(node).__name__ in ("TBackward0", "TransposeBackward0", "ViewBackward0"):
        node = node.next_functions[0][0]
    return type(node).__name__ == "AccumulateGrad"


def _signed(dim: int) -> int:
    """A saved dimension: torch keeps a negative one as an unsigned 64-bit integer."""
    return dim - (1 << 64) if dim >= 1 << 63 else dim
