"""What a training step's operators are: how many it dispatches (on a GPU each one is a kernel
launch), and where its time goes.

:class:`OperatorCount` is a ``TorchDispatchMode``: it sees every aten operator below autograd
(the backward and ``torch.func`` transforms included) and counts those that are not views
(``view``, ``slice``, ``permute``, ``detach``, ... only make new metadata). Work done outside
torch, such as the CPU's numpy sign loop, is not an operator and is not counted.

:func:`operator_times` profiles steps with ``torch.profiler``: per stage, the time of each
outermost aten operator (with the operators it calls) and the rest of the stage, the time outside
every aten operator: Python, the dispatcher's and autograd's own work, numpy.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter, defaultdict
from collections.abc import Callable
from typing import Any

from torch.autograd.profiler_util import FunctionEvent
from torch.profiler import ProfilerActivity, profile, record_function
from torch.utils._python_dispatch import TorchDispatchMode

STAGE_PREFIX = "stage:"  # the name of a stage's profiler range: ``stage:grads``


class OperatorCount(TorchDispatchMode):
    """Counts the non-view aten operators run inside it, by name (``counts``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:
        if func.namespace == "aten" and not func.is_view:
            self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Operators counted so far."""
        return sum(self.counts.values())


def ranged(name: str, fn: Callable[[], Any]) -> Any:
    """A step's ``stage(name, fn)`` that marks the stage as a profiler range."""
    with record_function(STAGE_PREFIX + name):
        return fn()


def operator_times(step: Callable[[Callable], Any], steps: int) -> dict[str, dict]:
    """Where ``steps`` calls of ``step(stage)`` spend their time, per stage, in ms per step.

    The times are the profiler's CPU times (on CUDA: the host's, launches included, not the
    kernels'), and the profiler adds its own cost to every operator it records: the stages take
    longer than unprofiled ones. An operator belongs to the stage it runs in: in the stage's
    thread, or in autograd's own thread (a CUDA backward) while the stage waits for it.

    Args:
        step: runs one training step, each of its stages through the ``stage(name, fn)`` it is
            given.
        steps: how many steps to profile.

    Returns:
        Stage -> ``{"ms": the stage, "other_ms": outside every aten operator, "ops": {name:
        {"ms": ..., "calls": per step}}}`` where ``ops`` holds the outermost aten operators only
        (an operator another one calls is in its caller's time), the slowest first.
    """
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step(ranged)
    events = prof.events()
    ranges = sorted(
        (event.time_range.start, event.time_range.end, event.name.removeprefix(STAGE_PREFIX))
        for event in events
        if event.name.startswith(STAGE_PREFIX)
    )
    stages: dict[str, float] = defaultdict(float)
    for start, end, stage in ranges:
        stages[stage] += end - start
    ops: dict[str, dict[str, list]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    for event in events:
        stage = _outermost_stage(event, ranges)
        if stage is not None:
            total = ops[stage][event.name]
            total[0] += event.cpu_time_total
            total[1] += 1
    return {stage: _stage_times(micros, ops[stage], steps) for stage, micros in stages.items()}


def _outermost_stage(event: FunctionEvent, ranges: list[tuple[int, int, str]]) -> str | None:
    """The stage of an aten operator that no other aten operator called, else ``None``.

    Its stage is the stage range above it in its thread, or, for an operator of a backward
    function that autograd ran in its own thread, the stage ``ranges`` (``(start, end, stage)``
    in time order) that was running then. An operator of any other thread (an intra-op worker's)
    is inside its caller's time already: ``None``.
    """
    if not event.name.startswith("aten::"):
        return None
    top, parent = event, event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return None
        if parent.name.startswith(STAGE_PREFIX):
            return parent.name.removeprefix(STAGE_PREFIX)
        top, parent = parent, parent.cpu_parent
    if not top.name.startswith("autograd::engine::"):
        return None
    index = bisect.bisect_right(ranges, (top.time_range.start, math.inf)) - 1  # began at or before
    if index < 0:
        return None
    _, end, stage = ranges[index]
    return stage if top.time_range.start <= end else None


def _stage_times(micros: float, ops: dict[str, list], steps: int) -> dict:
    """One stage's entry of :func:`operator_times` from its summed microseconds."""
    per_op = {
        name: {"ms": total / steps / 1e3, "calls": calls / steps}
        for name, (total, calls) in sorted(ops.items(), key=lambda item: -item[1][0])
    }
    in_ops = sum(op["ms"] for op in per_op.values())
    ms = micros / steps / 1e3
    return {"ms": ms, "other_ms": ms - in_ops, "ops": per_op}
