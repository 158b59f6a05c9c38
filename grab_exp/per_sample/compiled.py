"""``trainer.compile``: the gradient computation of a training step through ``torch.compile``.

What is captured, per pipeline:

* ``classic``: the model's forward and the loss, one graph; AOT autograd compiles the matching
  backward graph, which ``loss.backward()`` runs.
* ``functional`` with ``method=func``: the per-sample gradient function ``vmap(grad(loss of one
  example))`` - forward, backward and the batching over examples in one graph
  (:class:`~grab_exp.per_sample.func.FuncPerSample` wraps it with :func:`compile_step`).
* ``functional`` with ``method=hooks`` or ``factored``: not compiled. Its forward hooks read the
  autograd node of every layer's output, and Dynamo splits its graph at each one, so under
  compile ``method=auto`` resolves to ``func`` (with no fallback to ``loop``) and an explicit
  ``hooks`` is a config error.
* ``functional`` with ``method=loop``: not compiled (a Python loop over the examples); a config
  error.

The ordering's step, the GSNR and the optimizer stay eager (they are already a few fused
kernels with no host synchronization). The model itself is not wrapped, so ``state_dict()``
keys and checkpoints are those of an eager run. Graphs are static-shaped (``dynamic=False``): a
short last batch compiles a second graph.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from grab_exp.validation import check_choice

#: torch.compile's modes; ``reduce-overhead`` and ``max-autotune`` add CUDA graphs on CUDA.
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
_CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
#: ``pipeline.method`` values allowed with ``trainer.compile=true``.
COMPILABLE_METHODS = ("auto", "func")


def check_compile_method(method: str) -> None:
    """Raise a one-line ``ValueError`` unless per-sample ``method`` can be compiled."""
    if method not in COMPILABLE_METHODS:
        raise ValueError(
            f"pipeline.method: got {method!r} with trainer.compile=true; allowed: "
            f"{', '.join(COMPILABLE_METHODS)} (the hook path's per-layer hooks break "
            "torch.compile's graph at every layer; loop runs one example at a time in Python)"
        )


def compile_step(fn: Callable[..., Any], mode: str) -> Callable[..., Any]:
    """``fn`` compiled with ``torch.compile(mode=mode, dynamic=False)``.

    In the CUDA-graph modes every call first marks a new step, so the graph's outputs of the
    previous call (already consumed by then) may be overwritten.

    Raises:
        ValueError: one line naming ``trainer.compile_mode`` for an unknown ``mode``.
    """
    check_choice("trainer.compile_mode", mode, COMPILE_MODES)
    compiled = torch.compile(fn, mode=mode, dynamic=False)
    if mode not in _CUDA_GRAPH_MODES:
        return compiled

    def step(*args: Any) -> Any:
        torch.compiler.cudagraph_mark_step_begin()
        return compiled(*args)

    return step


def compiled_loss(
    model: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor], mode: str
) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``(x (B, ...), y (B,)) -> loss_fn(model(x), y)`` as one compiled graph (its backward too)."""
    return compile_step(lambda x, y: loss_fn(model(x), y), mode)
