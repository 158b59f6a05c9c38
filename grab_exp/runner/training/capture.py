"""Capture one training step and replay it: a CUDA graph on CUDA, its CPU analogue elsewhere.

A captured step repeats the first step's operators on the first step's tensors, with the
first step's Python values baked in. It equals eager training only when nothing in the step
depends on a host value that changes between steps (a position, a pending flag, a branch on a
tensor): each ordering keeps those as device tensors (:class:`~grab_exp.balance.Ordering`).

* :class:`~grab_exp.trace.TracedStep` (any device, the CPU's proof): the step's aten operators
  recorded and replayed (:mod:`grab_exp.trace`).
* :class:`CudaGraphStep`: ``torch.cuda.graph`` capture (the ordering's generators registered
  with the graph), then ``replay()``.

:class:`CapturedStep` runs the first step eagerly (on a side stream on CUDA), captures the
second and replays every later one. Both kinds read their inputs from static buffers:
:meth:`CapturedStep.__call__` copies ``x``, ``y`` and ``indices`` into them before each replay,
and returns the step's loss buffer, which the next replay overwrites.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch

from grab_exp.devices import graph_safe
from grab_exp.optim import device_step
from grab_exp.runner.training.step import StepParts, train_step
from grab_exp.trace import TracedStep

StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def register_generators(graph: torch.cuda.CUDAGraph, generators: Sequence[torch.Generator]):
    """Register ``generators`` with ``graph``, so that each replay draws new values.

    Needed by torch 2.11 (the GPU image's); torch 2.14 registers every generator a capture uses
    by itself and warns at each call that the method is a deprecated no-op, so that warning is
    silenced here; a torch without the method needs nothing.
    """
    if not hasattr(graph, "register_generator_state"):
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=r".*register_generator_state\(\) is deprecated")
        for generator in generators:
            graph.register_generator_state(generator)


class CudaGraphStep:
    """A step captured as one CUDA graph (``torch.cuda.graph``), replayed with one launch.

    Args:
        fn: the step, captured (the capture runs nothing: warm it up first, as
            :class:`CapturedStep` does).
        inputs: the static input tensors ``fn`` reads (refilled before each replay).
        generators: the CUDA generators the step draws from (registered with the graph, so
            each replay draws new values).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        inputs: Sequence[torch.Tensor],
        generators: Sequence[torch.Generator] = (),
    ) -> None:
        self.graph = torch.cuda.CUDAGraph()
        register_generators(self.graph, generators)
        with graph_safe(), torch.cuda.graph(self.graph):
            self.output = fn(*inputs)

    def replay(self) -> torch.Tensor:
        """Launch the graph; returns ``output`` holding this replay's value."""
        self.graph.replay()
        return self.output


@contextmanager
def side_stream(device: torch.device) -> Iterator[None]:
    """Run eager warm-up steps on a side stream, as CUDA graph capture requires (a no-op off
    CUDA)."""
    if device.type != "cuda":
        yield
        return
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)


class CapturedStep:
    """A training step of full batches: eager at its first call, captured at its second (which
    trains on its batch too), replayed at every later one.

    The first, eager call makes what a step makes once (an optimizer's buffers, caches); a
    capture would hold a new tensor that the eager code goes on to use no more.

    Args:
        fn: ``(x, y, indices) -> loss ()``, the eager step.
        device: where the step runs: CUDA captures a CUDA graph, others trace
            (:class:`TracedStep`).
        generators: what :class:`CudaGraphStep` registers.
        prepare: called before the first step (after a checkpoint is loaded, so that what it
            sets up holds the loaded state).
    """

    def __init__(
        self,
        fn: StepFn,
        device: torch.device,
        generators: Sequence[torch.Generator] = (),
        prepare: Callable[[], None] | None = None,
    ) -> None:
        self.fn, self.device, self.generators = fn, device, tuple(generators)
        self.prepare = prepare
        self.warm = False
        self.inputs: tuple[torch.Tensor, ...] | None = None
        self.graph: TracedStep | CudaGraphStep | None = None
        #: CUDA: the step's working memory, the capture's peak allocation above its start (a
        #: replay allocates from the graph's private pool, which the allocator's counters do
        #: not see); ``None`` before the capture and off CUDA
        self.step_peak_bytes: int | None = None
        #: CUDA: the allocator's peak before the capture reset it, until :meth:`take_peak_before`
        self.peak_before_capture: int | None = None

    def _capture(self) -> CudaGraphStep:
        """Capture the step, measuring its working memory with the allocator's counters."""
        torch.cuda.synchronize(self.device)
        self.peak_before_capture = torch.cuda.max_memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        start = torch.cuda.memory_allocated(self.device)
        graph = CudaGraphStep(self.fn, self.inputs, self.generators)
        torch.cuda.synchronize(self.device)
        self.step_peak_bytes = torch.cuda.max_memory_allocated(self.device) - start
        return graph

    def take_peak_before(self) -> int:
        """The allocator's peak that the capture reset (0 once taken, or without a capture)."""
        peak, self.peak_before_capture = self.peak_before_capture or 0, None
        return peak

    def __call__(self, x: torch.Tensor, y: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
        """One step on ``x (B, ...)``, ``y (B,)``, ``indices (B,)`` (the shapes of the first
        call at every call). Returns the loss ``()``: a replay's is its output buffer, which the
        next replay overwrites."""
        if not self.warm:
            if self.prepare is not None:
                self.prepare()
            self.warm = True
            with side_stream(self.device):  # CUDA graphs want their warm-up on a side stream
                return self.fn(x, y, indices)
        if self.graph is None:
            self.inputs = tuple(t.clone() for t in (x, y, indices))
            if self.device.type != "cuda":
                self.graph = TracedStep(self.fn, self.inputs)  # trains on this batch
                return self.graph.output
            self.graph = self._capture()  # runs nothing
        else:
            for buffer, value in zip(self.inputs, (x, y, indices), strict=True):
                buffer.copy_(value, non_blocking=True)
        return self.graph.replay()


def make_capturable(optimizer: torch.optim.Optimizer) -> None:
    """Keep a torch optimizer's step counts on the device (``capturable``), as a captured step
    needs: Adam's and AdamW's; SGD keeps none, and VRGD's are device tensors already."""
    if "capturable" not in optimizer.defaults:
        return
    for group in optimizer.param_groups:
        group["capturable"] = True
        for param in group["params"]:
            state = optimizer.state.get(param, {})
            if "step" in state:  # counted on the host so far (an eager run's checkpoint)
                state["step"] = device_step(state["step"], param)


def capture_step(parts: StepParts) -> CapturedStep:
    """:func:`~grab_exp.runner.training.step.train_step` of ``parts``, captured on its device at its
    second call: the ordering's projection stored and the optimizer made capturable first, the
    ordering's generator registered (its probabilistic thresholds draw anew at each replay)."""

    def prepare() -> None:
        parts.ordering.prepare_capture()
        make_capturable(parts.optimizer)

    step = functools.partial(train_step, parts)
    return CapturedStep(step, parts.ordering.device, [parts.ordering.generator], prepare)
