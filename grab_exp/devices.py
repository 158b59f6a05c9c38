"""Device identity: ``cuda`` and ``cuda:0`` are one device when device 0 is the current one."""

from __future__ import annotations

import torch


def same_device(a: torch.device | str, b: torch.device | str) -> bool:
    """Whether ``a`` and ``b`` name one device, after normalizing the index.

    A tensor reports ``cuda:0`` where it was asked for on ``cuda``, and ``cpu`` where it was
    asked for on ``cpu:0``: plain ``==`` calls them different.
    """
    return _indexed(torch.device(a)) == _indexed(torch.device(b))


def _indexed(device: torch.device) -> torch.device:
    """``cpu`` without an index; an accelerator with one (its current device when none given)."""
    if device.type == "cpu":
        return torch.device("cpu")
    backend = getattr(torch, device.type, None)  # torch.cuda, torch.xpu, ...; none for meta
    if device.index is None and hasattr(backend, "current_device"):
        return torch.device(device.type, backend.current_device())
    return device
