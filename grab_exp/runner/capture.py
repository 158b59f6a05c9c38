"""Capture one training step and replay it: a CUDA graph on CUDA, its CPU analogue elsewhere.

A captured step repeats the first step's operators on the first step's tensors, with the
first step's Python values baked in. It equals eager training only when nothing in the step
depends on a host value that changes between steps (a position, a pending flag, a branch on a
tensor): each ordering keeps those as device tensors (:class:`~grab_exp.balance.Ordering`).

* :class:`TracedStep` (any device, the CPU's proof): records every aten operator a step runs
  under a ``TorchDispatchMode`` (the autograd backward and the optimizer included), each
  argument either a tensor that lived before the step (kept by identity, as a CUDA graph keeps
  its addresses), one made by an earlier operator of the step, or a Python value (baked).
  :meth:`TracedStep.replay` runs the same operators again on the same tensors, without
  autograd. Reading a value on the host (``.item()``, ``if tensor``, ``.tolist()``,
  ``.numpy()``: the last two dispatch no operator, a ``TorchFunctionMode`` sees them) or an
  operator whose output shape depends on values (``nonzero``) fails the recording: a CUDA
  graph could not hold it either. Unlike a graph, a replay makes new tensors for what the step
  makes (a Python reference to one, such as ``param.grad``, keeps the traced step's), and on the
  CPU it is no faster than eager training overall (``results/bench/epoch_1t.json``, the
  ``:graph`` rows).
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
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from grab_exp.devices import graph_safe
from grab_exp.optim import device_step
from grab_exp.runner.step import StepParts, train_step

StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class CaptureError(RuntimeError):
    """The step cannot be captured: it reads a device value on the host, or makes a shape from
    one."""


class _Slot:
    """An argument that an earlier operator of the step produced (its output number)."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


_aten = torch.ops.aten
#: operators that hand a tensor's value to the host (``.item()``, ``if tensor``, ``==``)
HOST_READS = {_aten._local_scalar_dense.default, _aten.is_nonzero.default, _aten.equal.default}


class _NoHostReads(TorchFunctionMode):
    """Refuses the tensor methods that read values on the host without an aten operator."""

    NAMES = frozenset({"tolist", "numpy", "__array__", "item"})

    def __torch_function__(self, func, types, args=(), kwargs=None) -> Any:
        if getattr(func, "__name__", "") in self.NAMES:
            raise CaptureError(f"Tensor.{func.__name__} reads a device value on the host")
        return func(*args, **(kwargs or {}))


def _touches_tensors(func: Any, out: Any) -> bool:
    """Whether an operator makes or writes a tensor (``promote_types`` and the like do not:
    they need no replay)."""
    values = out if isinstance(out, (tuple, list)) else (out,)
    return func._schema.is_mutable or any(isinstance(v, torch.Tensor) for v in values)


class _Recorder(TorchDispatchMode):
    """Runs each operator and records it with its arguments as slots, tensors or values."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, list[int | None]]] = []
        # id(tensor made in the step) -> (slot, weak reference): no reference of ours keeps a
        # tensor alive (autograd steals a gradient only while nothing else holds it)
        self._slots: dict[int, tuple[int, weakref.ref]] = {}
        self.slot_count = 0

    def slot(self, value: torch.Tensor) -> int | None:
        """The slot of a tensor an operator of the step made, else ``None``."""
        entry = self._slots.get(id(value))
        return entry[0] if entry is not None and entry[1]() is value else None

    def _arg(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            slot = self.slot(value)
            return value if slot is None else _Slot(slot)
        if isinstance(value, (list, tuple)):
            return type(value)(self._arg(v) for v in value)
        return value

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:
        kwargs = kwargs or {}
        if _sized_by_values(func, args):
            raise CaptureError(f"{func} makes an output shape from tensor values")
        if func in HOST_READS:
            raise CaptureError(f"{func} hands a device value to the host (.item(), if tensor)")
        spec = (self._arg(list(args)), {k: self._arg(v) for k, v in kwargs.items()})
        out = func(*args, **kwargs)
        if not _touches_tensors(func, out):
            return out
        outputs = out if isinstance(out, (tuple, list)) else (out,)
        slots: list[int | None] = []
        for value in outputs:
            if isinstance(value, torch.Tensor):
                self._slots[id(value)] = (self.slot_count, weakref.ref(value))
                slots.append(self.slot_count)
                self.slot_count += 1
            else:
                slots.append(None)
        self.ops.append((func, *spec, slots))
        return out


def _resolve(value: Any, made: list[Any]) -> Any:
    if isinstance(value, _Slot):
        return made[value.index]
    if isinstance(value, (list, tuple)):
        return type(value)(_resolve(v, made) for v in value)
    if isinstance(value, dict):
        return {k: _resolve(v, made) for k, v in value.items()}
    return value


def _sized_by_values(func: Any, args: tuple) -> bool:
    """Whether ``func``'s output shape depends on tensor values (``nonzero``, a mask index)."""
    if torch.Tag.dynamic_output_shape not in func.tags:
        return False
    if func is torch.ops.aten.index.Tensor:  # integer indices give a shape from shapes alone
        indices = args[1]
        return any(i is not None and i.dtype in (torch.bool, torch.uint8) for i in indices)
    return True


class TracedStep:
    """A step recorded once (it runs for real while recorded) and replayed operator by operator.

    Args:
        fn: the step; called once, under the recorder, on ``inputs``.
        inputs: the static input tensors ``fn`` reads (refilled before each replay).
    """

    def __init__(self, fn: Callable[..., Any], inputs: Sequence[torch.Tensor]) -> None:
        recorder = _Recorder()
        with graph_safe(), _NoHostReads(), recorder:
            self.output = fn(*inputs)
        self._ops = recorder.ops
        self._slot_count = recorder.slot_count
        self._output_slot = recorder.slot(self.output)  # the replay copies it into ``output``

    @property
    def kernels(self) -> int:
        """Non-view operators one replay runs (on a GPU, the kernels of the step's graph)."""
        return sum(not func.is_view for func, *_ in self._ops)

    def replay(self) -> torch.Tensor:
        """Run the recorded operators again; returns ``output`` holding this replay's value."""
        made: list[Any] = [None] * self._slot_count
        with torch._C._AutoDispatchBelowADInplaceOrView():
            for func, args, kwargs, slots in self._ops:
                out = func(*_resolve(args, made), **_resolve(kwargs, made))
                outputs = out if isinstance(out, (tuple, list)) else (out,)
                for slot, value in zip(slots, outputs, strict=True):
                    if slot is not None:
                        made[slot] = value
            if self._output_slot is not None:
                self.output.copy_(made[self._output_slot])
        return self.output


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
    """:func:`~grab_exp.runner.step.train_step` of ``parts``, captured on its device at its
    second call: the ordering's projection stored and the optimizer made capturable first, the
    ordering's generator registered (its probabilistic thresholds draw anew at each replay)."""

    def prepare() -> None:
        parts.ordering.prepare_capture()
        make_capturable(parts.optimizer)

    step = functools.partial(train_step, parts)
    return CapturedStep(step, parts.ordering.device, [parts.ordering.generator], prepare)
