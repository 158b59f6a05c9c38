"""Devices: ``device=auto`` resolved, CUDA's numerics policy, and device identity (``cuda`` and
``cuda:0`` are one device when device 0 is the current one)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

_GRAPH_SAFE = False  # set by graph_safe()


@contextmanager
def graph_safe() -> Iterator[None]:
    """Inside it, code takes the path a captured step needs on every device: no host reads and
    no work outside torch (the CPU's numpy sign loop gives way to CUDA's kernels, the CPU's index
    check defers). A CUDA graph capture and :class:`~grab_exp.trace.TracedStep` run
    inside it; so does the bench when it counts CUDA's operators on the CPU."""
    global _GRAPH_SAFE
    before, _GRAPH_SAFE = _GRAPH_SAFE, True
    try:
        yield
    finally:
        _GRAPH_SAFE = before


def in_graph_safe() -> bool:
    """Whether the code runs inside :func:`graph_safe`."""
    return _GRAPH_SAFE


def host_reads_allowed(device: torch.device) -> bool:
    """Whether a step on ``device`` may read a device value on the host for free: on the CPU,
    outside :func:`graph_safe`."""
    return device.type == "cpu" and not _GRAPH_SAFE


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


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; others as given (checked by
    :func:`~grab_exp.runner.config.check.validate_config`). ``cuda:k`` becomes the current
    CUDA device (where kernels and CUDA generators without an index go)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is not None:
        torch.cuda.set_device(resolved)
    return resolved


def set_cuda_policy(device: torch.device, tf32: bool) -> None:
    """On CUDA: deterministic cuDNN without autotuning, and TF32 only when asked for.

    TF32 rounds matmul and convolution inputs to 10 mantissa bits (cuDNN convolutions use it
    by default from Ampere on): per-sample gradients, and so sign decisions, would then
    differ from float32 by far more than rounding. ``trainer.tf32=false`` (the default)
    keeps float32; ``true`` trades that for speed. Nothing changes on the CPU.
    """
    if device.type != "cuda":
        return
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # Both APIs agree: from torch 2.9 on, reading a legacy flag (Dynamo, Inductor and
    # get_float32_matmul_precision do) raises once it disagrees with the new settings. The
    # legacy setters first: they write the new settings too, cuDNN's as "none".
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9: the fp32_precision settings
        precision = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
        torch.backends.cudnn.rnn.fp32_precision = precision
