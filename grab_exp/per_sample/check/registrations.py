"""What a forward registers or removes, seen and undone: attributes, buffers, modules and
parameters it adds (torch's global registration hooks, logged for the watched modules), hooks it
registers or removes (a module's and the global ones); and the model's structure read without a
walk of its module tree on every call (:class:`ModelState`)."""

from __future__ import annotations

import collections
import contextlib
import functools
import types
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.lazy import LazyModuleMixin
from torch.nn.modules.module import (
    register_module_buffer_registration_hook,
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)
from torch.nn.utils import parametrize

from grab_exp.per_sample.rules.base import OWN_IDS


def take_added(attributes: list[tuple[Any, dict]], start: int) -> None:
    """Take away the attributes, buffers, modules and parameters a forward added since the
    snapshot (a step count made by the first run, ``if not hasattr(self, "n"): self.n = 0``,
    which every extra forward would advance; a head made by it, ``self.head = nn.Linear(...)``;
    registrations: those after the ``start``-th, :data:`_LOG`)."""
    owners = {id(m): m for m, _ in attributes}
    for k, owner, registry, name, made, none in list(_LOG):
        store = _registry(owners[owner], registry) if k > start and owner in owners else {}
        if id(store.get(name)) != made:  # one put back since (the snapshot's own)
            continue
        if none:  # registered as None (register_buffer("step", None)), set by a forward
            store[name] = None
        elif registry == "_modules" and name == "parametrizations":  # its class and weight too
            for tensor in list(store[name]):
                parametrize.remove_parametrizations(owners[owner], tensor, False)
        else:
            del store[name]
    for m, saved in attributes:
        for name in [name for name in vars(m) if name not in saved]:
            delattr(m, name)


@contextlib.contextmanager
def hooks_taken(registries: Iterable[dict | None]) -> Iterator[None]:
    """The hook ``registries`` (a tensor's ``_backward_hooks``, ``_post_accumulate_grad_hooks``)
    empty in the block, their hooks back after (the same dicts: torch's hooks read them)."""
    kept = [(r, dict(r)) for r in registries if r]
    for registry, _ in kept:
        registry.clear()
    try:
        yield
    finally:
        for registry, hooks in kept:
            registry.update(hooks)


def take_hooks(m: Any, start: int) -> None:
    """Take ``m``'s hooks of id ``start`` on (but the paths' own), with their flags: a flag that
    a first run set (HF's ``_output_capturing_hooks_installed``, taken by :func:`take_added`)
    goes with the hooks it installed, and the next forward sets both again."""
    registries = [_registry(m, n) for n in HOOKS + HOOK_FLAGS]
    for registered in registries[: len(HOOKS)]:
        for k in [k for k in registered if k >= start and k not in OWN_IDS]:
            for other in registries:  # the hook's entries in every registry
                other.pop(k, None)
    for p in _registry(m, "_parameters").values():  # register_hook's, a post-accumulate one's
        for registered in (getattr(p, n, None) for n in TENSOR_HOOKS):
            for k in [k for k in registered or () if k >= start]:
                del registered[k]


def hooks_of(attributes: dict) -> dict[str, dict]:
    """Copies of the hook registries among a module's ``attributes`` where one holds a hook that
    is not the paths' own (``{}``: none, the usual module's; the paths' own are not put back)."""
    for n in HOOKS:
        if (registry := attributes.get(n)) and not registry.keys() <= OWN_IDS:
            return {
                n: dict(r) for n in HOOKS + HOOK_FLAGS if isinstance(r := attributes.get(n), dict)
            }
    return {}


def put_hooks_back(registered: list[tuple[Any, dict[str, dict]]]) -> None:
    """Put back the hooks (not the paths' own) that a forward removed since :func:`hooks_of`
    copied them (a one-shot hook that removes itself once it ran), each in its place, with their
    flags."""
    for m, saved in registered:
        gone = {
            k
            for n in HOOKS
            for k, hook in saved.get(n, {}).items()
            if k not in _registry(m, n) and k not in OWN_IDS and not _lazy_init(hook)
        }
        for n, hooks in saved.items() if gone else ():
            _reinsert(_registry(m, n), hooks, gone)


def tensor_hooks_of(attributes: list[tuple[Any, dict]]) -> list[tuple[torch.Tensor, dict]]:
    """Copies of the hook registries of the modules' parameters (``register_hook``'s,
    ``register_post_accumulate_grad_hook``'s) that hold any (none, the usual parameter's)."""
    found = []
    for _, a in attributes:
        for p in (a.get("_parameters") or {}).values():
            if p is not None and (p._backward_hooks or p._post_accumulate_grad_hooks):
                found.append((p, {n: dict(r) for n in TENSOR_HOOKS if (r := getattr(p, n))}))
    return found


def put_tensor_hooks_back(registered: list[tuple[torch.Tensor, dict]]) -> None:
    """Put back the parameters' hooks that a block took away or removed since
    :func:`tensor_hooks_of` copied them (one the batch's own forward registered), in place."""
    for p, saved in registered:
        for n, hooks in saved.items():
            if (now := getattr(p, n, None)) is not None and (gone := hooks.keys() - now.keys()):
                _reinsert(now, hooks, gone)


def _reinsert(now: dict, saved: dict, gone: set) -> None:
    """The ``gone`` entries of the registry ``saved`` copied back into ``now``, each in its place
    (``saved``'s order, then what ``now`` holds besides)."""
    merged = {**now, **{k: saved[k] for k in gone if k in saved}}
    order = [k for k in saved if k in merged] + [k for k in now if k not in saved]
    now.clear()
    now.update((k, merged[k]) for k in order)


def _lazy_init(hook: Any) -> bool:
    """Whether ``hook`` is a lazy module's initialization, which its first run removes for good
    (the parameters it made stay)."""
    return getattr(hook, "__func__", None) is LazyModuleMixin._infer_parameters


def _registry(m: Any, name: str) -> dict:
    """A module's registry ``name`` (``{}``: none, or a scripted module's, which is no dict)."""
    registry = vars(m).get(name)
    return registry if isinstance(registry, dict) else {}


#: a module's registries of hooks (keyed by the hooks' ids) and their flags
HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks")
HOOK_FLAGS = (
    "_forward_hooks_with_kwargs",
    "_forward_hooks_always_called",
    "_forward_pre_hooks_with_kwargs",
)
#: a parameter's registries of hooks (keyed by the hooks' ids)
TENSOR_HOOKS = ("_backward_hooks", "_post_accumulate_grad_hooks")
#: torch's registries of global hooks (``register_module_forward_hook``'s), as a module's
GLOBAL = types.SimpleNamespace(
    **{n: getattr(torch.nn.modules.module, f"_global{n}", {}) for n in HOOKS + HOOK_FLAGS}
)
GLOBAL_VARS = (GLOBAL, vars(GLOBAL))


#: modules and parameters registered anywhere so far (torch's global registration hooks): a
#: model that has not changed since a path listed it costs no walk of its module tree to know
_REGISTRATIONS = [0]
#: new names registered on a watched module (one of a ModelState's, a loss's, a hidden one):
#: or set where it was None: their count, and ``(count, owner's id, registry, name, registered
#: object's id, whether the name was registered as None)`` of the last ones
_ADDED = [0]
_LOG: collections.deque = collections.deque(maxlen=1024)  # a block registering more: its first
_WATCHED: weakref.WeakSet = weakref.WeakSet()


def _registered(registry: str, module: nn.Module, name: str, value: Any) -> None:
    if registry != "_buffers":
        _REGISTRATIONS[0] += 1
    store = vars(module).get(registry, {})
    if module in _WATCHED and value is not None and store.get(name) is None:  # new, or was None
        _ADDED[0] += 1
        _LOG.append((_ADDED[0], id(module), registry, name, id(value), name in store))


def added_count() -> int:
    """New names registered on the watched modules so far (:data:`_ADDED`)."""
    return _ADDED[0]


def watch(modules: Any) -> None:
    """Log the new names registered on ``modules`` (:func:`_registered`)."""
    _WATCHED.update(modules)


def registered_on(owners: dict[int, nn.Module], since: int) -> str | None:
    """The first module or parameter registered on one of ``owners`` (by id) after the
    ``since``-th new name (:func:`added_count`): ``Owner.name``; ``None``: none."""
    made = (
        f"{type(owners[owner]).__name__}.{name}"
        for k, owner, registry, name, *_ in list(_LOG)
        if k > since and owner in owners and registry != "_buffers"
    )
    return next(made, None)


register_module_buffer_registration_hook(functools.partial(_registered, "_buffers"))
register_module_module_registration_hook(functools.partial(_registered, "_modules"))
register_module_parameter_registration_hook(functools.partial(_registered, "_parameters"))


class ModelState:
    """The model's modules and parameters, listed once (anew when :meth:`stale`)."""

    def __init__(self, model: nn.Module) -> None:
        self.modules, self.named = list(model.modules()), list(model.named_parameters())
        self.params = [p for _, p in self.named]
        self.owned = [(m, n, p) for m in self.modules for n, p in m._parameters.items()]
        self.children = [(m, len(m._modules)) for m in self.modules]
        self.ids = {id(m): m for m in self.modules}
        watch(self.modules)
        self._seen = _REGISTRATIONS[0]

    def stale(self, model: nn.Module) -> bool:
        """Whether the model's modules or parameters changed: others, renamed, removed or None (a
        removal fires no registration hook: ``del model.blocks[1]`` leaves a module fewer)."""
        if _REGISTRATIONS[0] == self._seen:
            removed = any(len(m._modules) != k for m, k in self.children)
            return removed or any(getattr(m, n, None) is not p for m, n, p in self.owned)
        self._seen = _REGISTRATIONS[0]
        modules = [id(m) for m in model.modules()] != [id(m) for m in self.modules]
        named = [(n, id(p)) for n, p in model.named_parameters()]  # prune.remove renames one
        return modules or named != [(n, id(p)) for n, p in self.named]

    def trainable(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.named if p.requires_grad}

    def key(self) -> tuple:
        """The trainable set and the modules' modes (a structure key)."""
        trainable = tuple([p.requires_grad for p in self.params])
        return trainable, tuple([m.training for m in self.modules])
