"""Peak memory of one training step: the most bytes live at once above those live at its start.

On CUDA the caching allocator's own counters give it (``reset_peak_memory_stats``, then
``max_memory_allocated - memory_allocated`` at the start). On the CPU torch keeps no such
counters, so two consecutive steps run under ``torch.profiler`` with ``profile_memory=True``:
every allocation and free of torch's CPU allocator is an event with a signed size, and the
running sum of the second step's events, in time order, is its live-bytes curve; its maximum is
the peak. (The profiler cannot size the free of a block allocated before it started, so the
first step only makes the blocks that the second one frees known.) Buffers that libraries
allocate outside torch's allocator (oneDNN or BLAS scratch space) are not counted on the CPU.
Both methods measure the same quantity, the step's working memory over what persists between
steps (model, optimizer and ordering state, last gradients).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import accumulate

import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import MEMORY_EVENT_NAME
from torch.profiler import ProfilerActivity, profile, record_function

from grab_exp.bench.timing import synchronize

STEP_MARK = "grab_exp.bench.step"
CUDA_METHOD = (
    "torch.cuda.max_memory_allocated after reset_peak_memory_stats, minus "
    "torch.cuda.memory_allocated at the step's start"
)
CPU_METHOD = (
    "torch.profiler (profile_memory=True) over two consecutive steps: maximum of the running "
    "sum of the second step's CPU allocation (+bytes) and free (-bytes) events in time order"
)


def tensor_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """The bytes of ``tensors``' elements."""
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_method(device: torch.device) -> str:
    """How :func:`peak_step_bytes` measures on ``device`` (written into the JSON)."""
    return CUDA_METHOD if device.type == "cuda" else CPU_METHOD


def peak_step_bytes(fn: Callable[[], object], device: torch.device) -> int:
    """Peak bytes live during ``fn()`` above those live when it starts (>= 0).

    Args:
        fn: One step: it runs once on CUDA, twice on the CPU (the peak is the second's).
        device: Where the step allocates: CUDA counters on ``cuda``, the profiler on ``cpu``.
    """
    if device.type == "cuda":
        return _cuda_peak(fn, device)
    return _cpu_peak(fn)


def _cuda_peak(fn: Callable[[], object], device: torch.device) -> int:
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    start = torch.cuda.memory_allocated(device)
    fn()
    synchronize(device)
    return max(torch.cuda.max_memory_allocated(device) - start, 0)


def _cpu_peak(fn: Callable[[], object]) -> int:
    """Profile two steps; integrate the second's events (the frees of blocks the first one
    allocated have known sizes; the profiler drops frees of blocks older than itself)."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        for _ in range(2):
            with record_function(STEP_MARK):
                fn()
    events = prof.profiler.kineto_results.events()
    start, end = [(e.start_ns(), e.end_ns()) for e in events if e.name() == STEP_MARK][-1]
    changes = sorted(
        (e.start_ns(), e.nbytes())
        for e in events
        if e.name() == MEMORY_EVENT_NAME
        and e.device_type() == DeviceType.CPU
        and start <= e.start_ns() <= end
    )
    return max([0, *accumulate(nbytes for _, nbytes in changes)])
