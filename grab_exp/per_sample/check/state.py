"""Nothing of a check stays (:func:`kept_state`); the model's structure, read without a walk of
its module tree on every call (:class:`ModelState`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.module import (
    register_module_module_registration_hook,
    register_module_parameter_registration_hook,
)


def saved_state(model: nn.Module, buffers: bool = True, modes: bool = False) -> Callable[[], None]:
    """The modules' attributes (a step counter kept as an ``int``, an activation kept on the
    model; modes where asked) and buffers as they are now; calling the result puts them back."""
    attributes = [(m, dict(vars(m))) for m in model.modules()]
    kept = saved_buffers(model) if buffers else []

    def restore() -> None:
        for m, saved in attributes:
            now = vars(m)
            for name in now.keys() - saved.keys():
                del now[name]
            now.update((n, v) for n, v in saved.items() if modes or n != "training")
        put_back(kept)

    return restore


@contextlib.contextmanager
def kept_state(model: nn.Module) -> Iterator[Callable[[], list[str]]]:
    """Buffers, attributes, modes, ``param.grad`` and random number generators put back after
    the block; yields a function that names the buffers changed so far."""
    buffers = saved_buffers(model)
    attributes = saved_state(model, buffers=False, modes=True)
    grads = [(p, p.grad) for p in model.parameters()]
    prefix = {id(m): f"{name}." if name else "" for name, m in model.named_modules()}

    def changed() -> list[str]:
        return [
            prefix.get(id(m), "") + name
            for m, name, b, version, _ in buffers
            if m._buffers.get(name) is not b or b._version != version
        ]

    with torch.random.fork_rng(devices=cuda_devices(model)):
        try:
            yield changed
        finally:
            put_back(buffers)
            attributes()
            for p, g in grads:
                p.grad = g


Buffers = list[tuple[nn.Module, str, torch.Tensor, int, torch.Tensor]]


def saved_buffers(model: nn.Module) -> Buffers:
    """Every buffer as it is now, ``(module, name, tensor, version, copy)``."""
    return [
        (m, name, b, b._version, b.detach().clone())
        for m in model.modules()
        for name, b in m._buffers.items()
        if b is not None
    ]


@torch.no_grad()
def put_back(buffers: Buffers) -> None:
    """The buffers as :func:`saved_buffers` saw them (only the changed ones written: a write
    would break the graphs that saved them)."""
    for m, name, b, version, saved in buffers:
        m._buffers[name] = b
        if b._version != version:
            b.copy_(saved)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for m, training in modes:
            m.training = training


#: modules and parameters registered anywhere so far (torch's global registration hooks): a
#: model that has not changed since a path listed it costs no walk of its module tree to know
_REGISTRATIONS = [0]


def _registered(*_: Any) -> None:
    _REGISTRATIONS[0] += 1


register_module_module_registration_hook(_registered)
register_module_parameter_registration_hook(_registered)


class ModelState:
    """The model's modules and parameters, listed once (anew when :meth:`stale`)."""

    def __init__(self, model: nn.Module) -> None:
        self.modules = list(model.modules())
        self.named = list(model.named_parameters())
        self.params = [p for _, p in self.named]
        self._seen = _REGISTRATIONS[0]

    def stale(self, model: nn.Module) -> bool:
        """Whether the model's modules or parameters are others than when listed."""
        if _REGISTRATIONS[0] == self._seen:
            return False
        self._seen = _REGISTRATIONS[0]
        return [id(m) for m in model.modules()] != [id(m) for m in self.modules] or [
            id(p) for p in model.parameters()
        ] != [id(p) for p in self.params]

    def trainable(self) -> dict[str, nn.Parameter]:
        return {n: p for n, p in self.named if p.requires_grad}

    def key(self) -> tuple:
        """The trainable set and the modules' modes (a structure key)."""
        return (
            tuple([p.requires_grad for p in self.params]),
            tuple([m.training for m in self.modules]),
        )


def cuda_devices(model: nn.Module) -> list[int]:
    return sorted({p.device.index or 0 for p in model.parameters() if p.device.type == "cuda"})
