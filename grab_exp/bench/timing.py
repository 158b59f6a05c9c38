"""Timing helpers: medians of repeats, device-synchronized; an ordering's next batches."""

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


def synchronize(device: torch.device) -> None:
    """Wait for queued work on ``device`` (a no-op on the CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(
    fn: Callable[[], object], device: torch.device, repeats: int, warmup: int = 3
) -> float:
    """Median wall time of ``fn()`` over ``repeats`` calls after ``warmup`` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        synchronize(device)
        start = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - start)
    return statistics.median(times)
