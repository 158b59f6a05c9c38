"""Trace one step's aten operators and replay them: the CPU's analogue of a CUDA graph.

:class:`TracedStep` (any device) records every aten operator a step runs under a
``TorchDispatchMode`` (the autograd backward and the optimizer included), each argument either
a tensor that lived before the step (kept by identity, as a CUDA graph keeps its addresses), one
made by an earlier operator of the step, or a Python value (baked). :meth:`TracedStep.replay`
runs the same operators again on the same tensors, without autograd. Reading a value on the host
(``.item()``, ``if tensor``, ``.tolist()``, ``.numpy()``: the last two dispatch no operator, a
``TorchFunctionMode`` sees them) or an operator whose output shape depends on values
(``nonzero``) fails the recording: a CUDA graph could not hold it either. Unlike a graph, a
replay makes new tensors for what the step makes (a Python reference to one, such as
``param.grad``, keeps the traced step's), and on the CPU it is no faster than eager training
overall (``results/bench/epoch_1t.json``, the ``:graph`` rows).

The training step's capture (:mod:`grab_exp.runner.training.capture`) uses it off CUDA; the tests
and the epoch benchmark use it to prove that a step reads no host value.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from grab_exp.devices import graph_safe


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
