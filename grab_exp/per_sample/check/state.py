"""Nothing of a check stays (:func:`kept_state`): the state a call found, put back
(:func:`saved_state`); what a forward registers or removes: :mod:`.registrations`."""

from __future__ import annotations

import collections
import contextlib
import copy
import functools
import random
import types
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.parameter import is_lazy
from torch.utils.hooks import RemovableHandle

try:
    import numpy as np
except ImportError:  # torch runs without numpy
    np = None

from grab_exp.per_sample.check.registrations import (
    GLOBAL,
    GLOBAL_VARS,
    added_count,
    hooks_of,
    put_hooks_back,
    put_tensor_hooks_back,
    take_added,
    take_hooks,
    tensor_hooks_of,
    watch,
)
from grab_exp.per_sample.layout import version
from grab_exp.per_sample.modules import UnsupportedModelError, draws_random


def saved_state(
    model: Any,
    buffers: bool = True,
    modes: bool = False,
    skip: frozenset[int] = frozenset(),
    copy_large: bool = True,
) -> Callable[[], None]:
    """The modules' attributes (a step counter kept as an ``int``, an activation kept on the
    model; modes where asked), the contents of those that are containers or tensors changed in
    place (:func:`saved_contents`) and buffers (:func:`saved_buffers`) as they are now; calling
    the result puts them back, takes away what a forward added since (:func:`take_added`; hooks:
    :func:`take_hooks`) and puts back the hooks it removed (:func:`put_hooks_back`).
    A module held in a container (an EMA teacher kept as ``self._t = [teacher]``, hidden from
    registration) is saved as a model of its own, buffers and parameters included.
    ``model`` may be an object other than a module (a loss's): its attributes alone; ``skip``:
    the ids of modules left out (a loss's: the model it holds); ``copy_large``: as
    :func:`saved_contents`' (off for a loss's and a hidden module's)."""
    module = isinstance(model, nn.Module)
    objects = [m for m in model.modules() if id(m) not in skip] if module else [model]
    attributes = [(m, dict(vars(m))) for m in objects]
    start, hooks = added_count(), RemovableHandle.next_id  # what is registered next: later ones
    registered = [(m, r) for m, a in (*attributes, GLOBAL_VARS) if (r := hooks_of(a))]
    tensor_hooks = tensor_hooks_of(attributes)
    contents = saved_contents(attributes, getattr(model, "training", True), copy_large)
    kept = saved_buffers(model, skip) if buffers and module else []
    hidden = []
    if contents.hidden:  # rare: no walk of its own otherwise
        known = skip | {id(m) for m in objects}
        hidden = [h for h in contents.hidden if id(h) not in known]
        watch(m for h in hidden for m in h.modules())
        hidden = [saved_state(h, True, modes, known, copy_large=False) for h in hidden]

    def added() -> bool:
        return added_count() != start or any(len(vars(m)) > len(a) for m, a in attributes)

    def restore(mode: bool | None = None) -> None:  # mode: as put_back's
        if added():
            take_added(attributes, start)
        if RemovableHandle.next_id != hooks:  # a hook registered anywhere since (ours too)
            for m in (*objects, GLOBAL):
                take_hooks(m, hooks)
        put_hooks_back(registered)
        put_tensor_hooks_back(tensor_hooks)
        for m, saved in attributes:
            vars(m).update((n, v) for n, v in saved.items() if modes or n != "training")
        try:
            contents.put_back(mode)
        finally:
            put_back(kept, mode)
            for inner in hidden:
                inner(mode)

    def moved() -> bool:  # whether an attribute is another object now (a count advanced)
        others = any(vars(m).get(n) is not v for m, saved in attributes for n, v in saved.items())
        return others or added() or contents.moved() or any(h.moved() for h in hidden)

    restore.moved = moved
    return restore


class ExtraLoss:
    """``loss_fn`` for its calls besides the batch's own (the checks', ``func``'s ``vmap``,
    ``loop``'s examples): each on the state the call found (:meth:`begin`), leaving the state as
    it was. A loss with state of its own (an ``nn.Module``, an object with attributes, a bound
    method's object, a ``functools.partial`` of either: a KL weight annealed by a count of its
    calls) would be advanced by each, as a model's attributes would; the ``model``'s modules it
    holds are the model's state, not the loss's."""

    def __init__(self, loss_fn: Callable, model: nn.Module) -> None:
        self.fn, self._found, self.owner = loss_fn, None, state_owner(loss_fn)
        self.skip = frozenset(map(id, model.modules()))
        if isinstance(self.owner, nn.Module):
            watch(self.owner.modules())
        self.stateful, self.in_model = self.owner is not None, id(self.owner) in self.skip
        if self.in_model:  # a method of the model's: its module's own attributes alone
            self.skip -= {id(self.owner)}

    def begin(self) -> None:
        """At a call's start: the state its extra calls run on."""
        self._found = self._saved() if self.stateful else None

    def back(self) -> None:
        """Put back the state the call found (a path left in the middle of a call)."""
        if self._found is not None:
            self._found()

    def __call__(self, out: Any, y: Any) -> Any:
        if self._found is None:
            return self.fn(out, y)
        now = self._saved()
        self._found()
        try:
            return self.fn(out, y)
        finally:
            now()

    def _saved(self) -> Callable[[], None]:
        return saved_state(self.owner, not self.in_model, skip=self.skip, copy_large=False)


def state_owner(loss_fn: Any) -> Any:
    """What holds ``loss_fn``'s state: itself, a bound method's object, a partial's function's
    (``None``: a function, whose closure is not seen)."""
    while isinstance(loss_fn, functools.partial):
        loss_fn = loss_fn.func
    if isinstance(loss_fn, types.MethodType):
        loss_fn = loss_fn.__self__
    plain = isinstance(loss_fn, FUNCTIONS) or not hasattr(loss_fn, "__dict__")
    return None if plain and not isinstance(loss_fn, nn.Module) else loss_fn


#: losses without state of their own (a function's closure cells are not seen)
FUNCTIONS = (types.FunctionType, types.BuiltinFunctionType, types.BuiltinMethodType, type)
#: nn.Module's own attributes (its registries, hook dicts and flags): not the model's state
MODULE_OWN = frozenset(vars(nn.Module()))
#: containers a forward may change in place (a feature log's ``append``, a count in a dict)
CONTAINERS = (list, dict, set, collections.deque)
#: what an attribute must be for a snapshot to look inside (a tuple may hold a list)
HOLDING = (*CONTAINERS, tuple, torch.Tensor)
HOLDING_MODULES = (*HOLDING, nn.Module)  # and what a tuple may hold that is looked at
LOOKED_AT = (*HOLDING_MODULES, types.MethodType)  # an attribute looked at
#: tensor attributes up to this many elements are copied by every snapshot (a count, a running
#: mean); a larger one (a position table kept unregistered) as a frozen parameter is
COPIED_NUMEL = 1 << 16


class Contents:
    """The contents of the modules' container attributes (a shallow copy of each container,
    nested ones too) and the values of the tensors among them, which are neither buffers nor
    parameters (:func:`saved_contents`), as of the model's ``mode``."""

    def __init__(self, mode: bool) -> None:
        self.containers: list = []  # (container, shallow copy)
        self.tensors: list = []  # (name, tensor, version, copy or None)
        self.hidden: list[nn.Module] = []  # modules held in containers
        self.mode, self.seen = mode, set()

    def moved(self) -> bool:
        changed = any(_differ(c, saved) for c, saved in self.containers)
        return changed or any(version(t) != stamp for _, t, stamp, _ in self.tensors)

    @torch.no_grad()
    def put_back(self, mode: bool | None = None) -> None:
        """Each container's contents and each tensor's values as they were (only what changed is
        written: a write would break the graphs that saved a tensor); ``mode``: as
        :func:`put_back`'s, which tensors a block of forwards in that mode changes is learned.
        ``UnsupportedModelError``: a tensor without a copy changed (later snapshots copy it)."""
        for container, saved in self.containers:
            if _differ(container, saved):
                _refill(container, saved)
        for where, t, stamp, saved in self.tensors:
            changed = version(t) != stamp
            if mode is not None:
                learn(t, mode, changed or _written(t, saved))
            if _restore(t, saved, changed):  # lost: no copy
                learn(t, self.mode, True)
                raise UnsupportedModelError(
                    f"{where}: the model's forward changed this tensor in place for the first "
                    "time, which this call cannot undo (each example's forward runs on the "
                    "attributes the call found); later calls copy it first; or register it as a "
                    "buffer (register_buffer)"
                )


def saved_contents(attributes: list[tuple[Any, dict]], mode: bool, copy_large=True) -> Contents:
    """:class:`Contents` of the attributes ``(module, vars)``: every container's items (nested
    containers' too), and a copy of each tensor without a gradient among them: always up to
    :data:`COPIED_NUMEL` elements at the top, else as of a frozen parameter (:func:`saved_buffers`:
    until a block of forwards in the model's ``mode`` left it as it was; inside a container, or
    with ``copy_large`` off, only once one changed it; a version for the others)."""
    contents = Contents(mode)
    for m, saved in attributes:
        for n, v in saved.items():  # most of a module's attributes are nn.Module's own
            if n in MODULE_OWN or not isinstance(v, LOOKED_AT):
                continue
            if isinstance(v, HOLDING):
                if _holds(v):
                    _walk(v, (m, n), (mode, True, copy_large), contents)
            elif (hidden := _module_of(v)) is not None:
                contents.hidden.append(hidden)  # set past registration, or a module's method
    return contents


def _module_of(v: Any) -> nn.Module | None:
    """``v`` where it is a module (set with ``object.__setattr__``, not registered), or the
    module of a bound method (``self._teacher = teacher.forward``); else ``None``."""
    owner = v.__self__ if isinstance(v, types.MethodType) else v
    return owner if isinstance(owner, nn.Module) else None


def _holds(v: Any) -> bool:
    """Whether ``v`` needs a look: not a tuple of plain values (a layer's ``kernel_size``)."""
    return not isinstance(v, tuple) or any(isinstance(item, HOLDING_MODULES) for item in v)


def _walk(v: Any, where: tuple, how: tuple, found: Contents) -> None:
    """Record ``v`` in ``found``: a container (once) and what it holds (a module too), or a
    tensor without a gradient; ``where``: its module and attribute; ``how``: the mode, whether
    ``v`` is the attribute itself (not inside a container), ``copy_large``."""
    mode, top, large = how
    if isinstance(v, torch.Tensor):
        if not v.requires_grad and not is_lazy(v):
            small = (top and v.numel() <= COPIED_NUMEL) or v.is_inference()  # no version: copied
            copied = small or getattr(v, CHANGED, {}).get(mode, top and large)
            name = f"{type(where[0]).__name__}.{where[1]}{'' if top else '[...]'}"
            found.tensors.append((name, v, version(v), v.detach().clone() if copied else None))
    elif id(v) not in found.seen:
        found.seen.add(id(v))
        if not isinstance(v, tuple):
            found.containers.append((v, copy.copy(v)))
        for item in v.values() if isinstance(v, dict) else v:
            if isinstance(item, HOLDING):
                _walk(item, where, (mode, False, large), found)
            elif isinstance(item, nn.Module):
                found.hidden.append(item)


def _differ(container: Any, saved: Any) -> bool:
    if len(container) != len(saved):
        return True
    if isinstance(container, dict):  # in order: an LRU cache's move_to_end is a change
        pairs = zip(container.items(), saved.items(), strict=True)
        return any(k is not j or v is not w for (k, v), (j, w) in pairs)
    if isinstance(container, set):
        return container != saved
    return any(a is not b for a, b in zip(container, saved, strict=True))


def _refill(container: Any, saved: Any) -> None:
    if isinstance(container, list):
        container[:] = saved
    else:
        container.clear()
        (container.extend if isinstance(container, collections.deque) else container.update)(saved)


@contextlib.contextmanager
def kept_state(model: nn.Module) -> Iterator[Callable[[], list[str]]]:
    """Buffers and parameters (:func:`saved_buffers`), attributes, modes, ``param.grad`` and RNGs
    put back after the block; yields a function naming the buffers and parameters changed (or
    made) so far."""
    buffers, mode = saved_buffers(model), model.training
    attributes = saved_state(model, buffers=False, modes=True)
    grads = [(p, p.grad) for p in model.parameters()]

    def changed() -> list[str]:
        known = {where for _, _, where, *_ in buffers}
        return [
            where
            for m, name, where, t, stamp, _ in buffers
            if name not in (store := _store(m, t)) or store[name] is not t or _moved(t, stamp)
        ] + [n for n, _ in model.named_buffers() if n not in known]  # made by a forward

    with forked_generators():
        done = False
        try:
            yield changed
            done = True
        finally:  # what a block of forwards changes is learned, where none stopped half-way
            for p, g in grads:
                p.grad = g
            put_back(buffers, mode if done else None)
            attributes(mode if done else None)


@contextlib.contextmanager
def random_modules_off(model: nn.Module) -> Iterator[list[nn.Module]]:
    """The modules that draw random numbers (:func:`~.modules.draws_random`) in eval mode for the
    block, so that every forward is the same function; yields them."""
    drawing = [m for m in model.modules() if draws_random(m)]
    for module in drawing:
        module.training = False
    try:
        yield drawing
    finally:
        for module in drawing:  # drawing is in training mode only
            module.training = True


#: ``(module, name, qualified name, tensor, stamp, copy)`` per buffer and parameter (:func:`_stamp`)
Buffers = list[tuple[nn.Module, str, str, torch.Tensor, tuple, torch.Tensor | None]]
#: on a frozen parameter, per training mode of the model, whether the forwards of a kept block
#: changed it in place (an EMA encoder updated in ``forward``, in training mode): those, and the
#: ones no block of that mode ran on yet, are copied, not the others
CHANGED = "_grab_exp_changed_by_forward"


def saved_buffers(model: nn.Module, skip: frozenset[int] = frozenset()) -> Buffers:
    """Every buffer and parameter as it is now: a copy of every buffer and of every frozen
    parameter that a forward changed in place or that no snapshot put back yet (``None`` for the
    others: their versions tell a change); ``skip``: ids of modules left out."""
    saved, mode = [], model.training
    for prefix, m in model.named_modules():
        if id(m) in skip:
            continue
        tensors = [(n, b, True) for n, b in m._buffers.items() if b is not None]
        tensors += [
            (n, p, not p.requires_grad and getattr(p, CHANGED, {}).get(mode, True))
            for n, p in m._parameters.items()
            if p is not None and not is_lazy(p)  # a lazy one is made by its first forward
        ]
        for n, t, copied in tensors:
            where = f"{prefix}.{n}" if prefix else n
            saved.append((m, n, where, t, _stamp(t), t.detach().clone() if copied else None))
    return saved


def _stamp(t: torch.Tensor) -> tuple[int, int, torch.Tensor]:
    """``t``'s version, its storage and a view of it: ``p.data = p.data * m + ...`` (MoCo's
    momentum update) gives ``p`` other storage and leaves its version as it was."""
    return version(t), t.data_ptr(), t.data


def _moved(t: torch.Tensor, stamp: tuple[int, int, torch.Tensor]) -> bool:
    return version(t) != stamp[0] or t.data_ptr() != stamp[1]


@torch.no_grad()
def put_back(buffers: Buffers, mode: bool | None = None) -> None:
    """The buffers and parameters as :func:`saved_buffers` saw them (only the changed ones
    written: a write would break the graphs that saved them); ``mode``: the model's training mode
    when they ran, where the snapshot held forwards (which frozen parameters they change is
    learned). ``UnsupportedModelError``: a parameter without a copy changed (an EMA of a
    trainable weight in ``forward``; not an ``Embedding(max_norm=...)``'s idempotent renorm)."""
    for m, name, where, t, stamp, saved in buffers:
        holder = next((s for s in (m._parameters, m._buffers) if name in s), None)
        if holder is None or holder[name] is not t:  # not written where it is (a script module's)
            _store(m, t)[name] = t
        changed = _moved(t, stamp)
        if t.data_ptr() != stamp[1]:  # .data given other storage: the old one is as it was
            t.data, changed = stamp[2], version(t) != stamp[0]
        if mode is not None and isinstance(t, nn.Parameter) and not t.requires_grad:
            learn(t, mode, changed or _written(t, saved))
        lost = _restore(t, saved, changed)
        if lost and not (isinstance(m, nn.Embedding) and m.max_norm is not None):
            fix = (  # a frozen one is copied from now on, as every one a forward changed
                "freeze it (requires_grad=False) or change it outside the forward"
                if t.requires_grad
                else "later calls copy it first; or change it outside the forward"
            )
            raise UnsupportedModelError(
                f"{where}: the model's forward changed this parameter in place, which this call "
                f"cannot undo (each example's forward runs on the parameters the call found); {fix}"
            )


def _restore(t: torch.Tensor, saved: torch.Tensor | None, changed: bool) -> bool:
    """``t`` as its copy ``saved``; whether the change is lost (``changed`` without a copy).
    Changed (its version moved): copied back, resized where resized in place (an observer's
    scale, per channel now); an inference tensor, which has no version, in inference mode;
    else written through ``.data``, its version as it is, since a
    change through ``.data`` in place (``p.data.mul_(m)``, an EMA) leaves no version to tell it
    (not inside ``torch.func``'s transforms, where a write to a captured tensor raises and
    ``.data`` is refused)."""
    if saved is None:
        return changed
    if t.is_inference():  # no version, written where it can be: in inference mode
        with torch.inference_mode():
            t.resize_(saved.shape).copy_(saved)
    elif changed:
        if t.shape != saved.shape:
            t.resize_(saved.shape)
        t.copy_(saved)
    elif torch._C._functorch.maybe_current_level() is None:
        t.data.copy_(saved)
    return False


def _written(t: torch.Tensor, saved: torch.Tensor | None) -> bool:
    """Whether ``t`` differs from its copy ``saved``: a change through ``.data`` in place
    (``p.data.mul_(m)``, an EMA) leaves the version as it was. Read where a block of forwards
    learns (a check's, which reads the host anyway)."""
    return saved is not None and not torch.equal(t, saved)


def learn(t: torch.Tensor, mode: bool, changed: bool) -> None:
    """Mark on ``t`` whether a block of forwards in the model's ``mode`` changed it (once changed,
    always: every later snapshot in that mode copies it; :data:`CHANGED`)."""
    marks = vars(t).setdefault(CHANGED, {})
    marks[mode] = marks.get(mode, False) or changed


def _store(module: nn.Module, tensor: torch.Tensor) -> dict:
    return module._parameters if isinstance(tensor, nn.Parameter) else module._buffers


def generator_states(others: bool = True) -> list:
    """The states of the generators a forward may draw from: torch's default CPU one, the CUDA
    ones in use, numpy's global one and Python's ``random`` (a forward that draws moves one:
    HuggingFace wav2vec2's SpecAugment masks are numpy's, a LayerDrop's coin Python's);
    ``others=False``: torch's CPU one alone, ``None`` for numpy's and Python's (neither read nor
    set)."""
    if not others:
        return [torch.get_rng_state(), None, None]
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else []
    drawn = None if np is None else np.random.get_state()
    return [torch.get_rng_state(), *cuda, drawn, random.getstate()]


def set_generator_states(states: list) -> None:
    torch.set_rng_state(states[0])
    if cuda := states[1:-2]:
        torch.cuda.set_rng_state_all(cuda)
    if states[-2] is not None:
        np.random.set_state(states[-2])
    if states[-1] is not None:
        random.setstate(states[-1])


@contextlib.contextmanager
def forked_generators() -> Iterator[None]:
    """Every generator of :func:`generator_states` put back after the block."""
    states = generator_states()
    try:
        yield
    finally:
        set_generator_states(states)


def drew_since(states: list) -> bool:
    """Whether a generator moved since :func:`generator_states` gave ``states``: compared on the
    host, no tensor operation (a captured step may run none that reads a value)."""
    return any(draws_since(states))


def draws_since(states: list) -> tuple[bool, bool]:
    """Whether torch's generators moved since ``states`` (:func:`generator_states`), and whether
    numpy's or Python's did (draws that ``torch.func``'s ``vmap`` lets pass: one for all)."""
    moved = list(map(_moved_state, states, generator_states()))
    return any(moved[:-2]), any(moved[-2:])


def _moved_state(before: Any, now: Any) -> bool:
    if before is None or now is None:  # not read (others=False), or no numpy
        return False
    if isinstance(before, torch.Tensor):
        return before.numpy().tobytes() != now.numpy().tobytes()
    if isinstance(before, tuple) and np is not None and isinstance(before[1], np.ndarray):
        return before[0] != now[0] or before[2:] != now[2:] or not np.array_equal(before[1], now[1])
    return before != now  # Python's, or no numpy
