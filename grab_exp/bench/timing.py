"""Timing helpers: medians of repeats, device-synchronized; an ordering's next batches; a
fixed batch."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


class EpochCursor:
    """The next batches of an ordering's epochs, counted here: reading the ordering's position
    (``Ordering.pos``) would make the host wait for a CUDA device at every timed step.

    Args:
        ordering: a fresh ordering (at the start of an epoch).
        rows: examples per batch.
    """

    def __init__(self, ordering, rows: int) -> None:
        self.ordering, self.rows, self.stepped = ordering, rows, 0

    def next(self) -> torch.Tensor:
        """``(rows,)`` dataset indices of the next batch, after a new epoch when the current one
        has fewer left."""
        ordering = self.ordering
        if self.stepped + self.rows > ordering.n:
            ordering.set_epoch(ordering.epoch + 1)
            self.stepped = 0
        indices = ordering.order[self.stepped : self.stepped + self.rows]  # (rows,)
        self.stepped += self.rows
        return indices

    def step(self, grads) -> None:
        """The ordering's ``step`` on ``grads`` at the next batch (:meth:`next`)."""
        self.next()
        self.ordering.step(grads)


def make_batch(batch: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed CIFAR-10-shaped batch: ``(B, 3, 32, 32)`` inputs and ``(B,)`` labels."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=generator).to(device)  # (B, 3, 32, 32)
    y = torch.randint(0, 10, (batch,), generator=generator).to(device)  # (B,)
    return x, y


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(fn: Callable[[], object], device: torch.device) -> tuple[object, float]:
    """``fn()``'s result and its wall seconds, ``device`` synchronized before and after."""
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def interleaved_seconds(
    calls: dict[str, Callable[[], object]], device: torch.device, repeats: int, warmup: int = 3
) -> dict[str, list[float]]:
    """Wall seconds of each call over ``repeats`` interleaved rounds (call 1, call 2, ..., call
    1, ...) after ``warmup`` untimed rounds, each call timed on its own; name -> its times."""
    for _ in range(warmup):
        for call in calls.values():
            call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            times[name].append(timed(call, device)[1])
    return times


def median_seconds(
    fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 3
) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    return statistics.median(interleaved_seconds({"fn": fn}, device, repeats, warmup)["fn"])
