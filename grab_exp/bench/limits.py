"""Each stage of a training step against its limit on this machine.

A stage's limit is the time that the data it must move and the arithmetic it must do take at
the machine's rates, measured in the same sitting (:func:`machine_rates`): ``max(bytes /
stream rate, flops / matmul rate)``, a roofline bound that no implementation of the stage goes
below on this machine. What each stage must do comes from the shapes alone
(:class:`~grab_exp.balance.base.Work`):

* ``grads``: the classic forward and backward's floating-point operations (counted by
  :class:`torch.utils.flop_counter.FlopCounterMode`: matrix products and convolutions), the
  parameters read once, and in a functional pipeline the ``B x d`` per-sample rows written
  once (the extra over a classic step);
* ``gsnr``: the ``B x d`` rows read once, a sum and a sum of squares a value;
* ``ordering``: the ordering's own :meth:`~grab_exp.balance.base.Ordering.work`;
* ``opt``: each parameter, its gradient and each optimizer state tensor of its shape read once,
  the parameter and the state written once, two flops a value of each.

A stage's multiple is its measured time over its limit: how far it is from what this machine
allows.
"""

from __future__ import annotations

import copy

import torch
from torch.utils.flop_counter import FlopCounterMode

from grab_exp.balance.base import NO_WORK, Work
from grab_exp.bench.timing import median_seconds

#: values per operand of the stream measurement (64 MiB of float32: past every cache)
STREAM_VALUES = 1 << 24
#: side of the square float32 product of the matmul measurement
MATMUL_SIDE = 1024


def machine_rates(device: torch.device, repeats: int = 15) -> dict[str, float]:
    """The machine's memory-stream rate (``c = a + b`` over :data:`STREAM_VALUES` float32
    values: two reads and a write) and matmul rate (a square float32 product of side
    :data:`MATMUL_SIDE`), medians of ``repeats``.

    Returns:
        ``{"stream_gb_s": ..., "matmul_gflop_s": ...}`` (10^9 bytes or flops a second).
    """
    a, b, c = (torch.rand(STREAM_VALUES, device=device) for _ in range(3))
    stream = median_seconds(lambda: torch.add(a, b, out=c), device, repeats)
    m = torch.rand(MATMUL_SIDE, MATMUL_SIDE, device=device)
    out = torch.empty_like(m)
    matmul = median_seconds(lambda: torch.mm(m, m, out=out), device, repeats)
    return {
        "stream_gb_s": 3 * a.numel() * a.element_size() / stream / 1e9,
        "matmul_gflop_s": 2 * MATMUL_SIDE**3 / matmul / 1e9,
    }


def model_flops(model: torch.nn.Module, loss_fn, x: torch.Tensor, y: torch.Tensor) -> int:
    """Floating-point operations of a classic forward and backward of ``loss_fn(model(x), y)``
    (on a copy of the model: nothing of the model's changes)."""
    twin = copy.deepcopy(model)
    with FlopCounterMode(display=False) as counter:
        loss_fn(twin(x), y).backward()
    return counter.get_total_flops()


def grads_work(step, x: torch.Tensor, y: torch.Tensor) -> Work:
    """The ``grads`` stage of a step's parts (:class:`~grab_exp.runner.training.step.
    StepParts`) on the batch ``x``, ``y``: see the module's description."""
    params = [p for p in step.model.parameters() if p.requires_grad]
    d = sum(p.numel() for p in params)
    size = params[0].element_size()
    rows = len(y) * d * size if step.needs_grads else 0  # the per-sample rows written
    return Work(d * size + rows, model_flops(step.model, step.loss, x, y))


def gsnr_work(rows: int, d: int, size: int) -> Work:
    """The ``gsnr`` stage: ``rows x d`` values read, a sum and a sum of squares a value."""
    return Work(rows * d * size, 3 * rows * d)


def optimizer_work(optimizer: torch.optim.Optimizer) -> Work:
    """The ``opt`` stage: see the module's description (the state as it stands: after a step,
    every tensor the optimizer keeps)."""
    work = NO_WORK
    for group in optimizer.param_groups:
        for p in group["params"]:
            state = optimizer.state.get(p, {})
            kept = sum(
                1 for t in state.values() if isinstance(t, torch.Tensor) and t.shape == p.shape
            )
            values, size = p.numel(), p.element_size()
            work += Work(values * size * (3 + 2 * kept), values * 2 * (1 + kept))
    return work


def limit_seconds(work: Work, rates: dict[str, float]) -> float:
    """The roofline time of ``work`` at ``rates`` (:func:`machine_rates`)."""
    return max(
        work.bytes / (rates["stream_gb_s"] * 1e9), work.flops / (rates["matmul_gflop_s"] * 1e9)
    )


def stage_limits(step, x: torch.Tensor, y: torch.Tensor, rates: dict[str, float]) -> dict:
    """Each stage a step runs -> its ``bytes``, ``flops`` and ``limit_ms`` (``gsnr`` only with
    a GSNR optimizer)."""
    rows, d = len(y), step.ordering.d
    size = next(step.model.parameters()).element_size()
    works = {
        "grads": grads_work(step, x, y),
        "gsnr": gsnr_work(rows, d, size) if step.uses_gsnr else None,
        "ordering": step.ordering.work(rows),
        "opt": optimizer_work(step.optimizer),
    }
    return {
        stage: {
            "bytes": work.bytes,
            "flops": work.flops,
            "limit_ms": limit_seconds(work, rates) * 1e3,
        }
        for stage, work in works.items()
        if work is not None
    }


def multiples(breakdown_ms: dict, limits: dict) -> dict[str, float | None]:
    """Each stage's measured time over its limit (``None``: a stage with no limit, as RR's
    ordering, or one not timed)."""
    out = {}
    for stage, limit in limits.items():
        ms = breakdown_ms.get(stage)
        out[stage] = ms / limit["limit_ms"] if ms is not None and limit["limit_ms"] > 0 else None
    return out
