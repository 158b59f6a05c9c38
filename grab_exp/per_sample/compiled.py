"""``trainer.compile``: ``classic`` compiles the forward and loss as one graph, ``method=func``
its ``vmap(grad)``; the hook path and ``loop`` are not compiled (``auto`` is ``func``, with no
``loop`` after it). The model is not wrapped; graphs are static-shaped."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from grab_exp.validation import check_choice

#: torch.compile's modes; ``reduce-overhead`` and ``max-autotune`` add CUDA graphs on CUDA.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
#: ``pipeline.method`` values allowed with ``trainer.compile=true``.
COMPILABLE_METHODS = ("auto", "func")


def check_compile_method(method: str) -> None:
    if method not in COMPILABLE_METHODS:
        raise ValueError(
            f"pipeline.method: got {method!r} with trainer.compile=true; allowed: "
            f"{', '.join(COMPILABLE_METHODS)} (the hook path's per-layer hooks break "
            "torch.compile's graph at every layer; loop runs one example at a time in Python)"
        )


def compile_step(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """``fn`` compiled with ``torch.compile(mode=mode, dynamic=False)``; in the CUDA-graph modes
    every call first marks a new step (the previous call's outputs, consumed, may be
    overwritten). ``ValueError`` naming ``trainer.compile_mode`` for an unknown ``mode``."""
    check_choice("trainer.compile_mode", mode, COMPILE_MODES)
    compiled = torch.compile(fn, mode=mode, dynamic=False)
    if mode not in ("reduce-overhead", "max-autotune"):
        return compiled

    def step(*args: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    return step
