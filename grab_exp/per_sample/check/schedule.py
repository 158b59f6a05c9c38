"""When a path runs a full check (:class:`Check`), and what it keeps on the device until then."""

from __future__ import annotations

from typing import Any

import torch

from grab_exp.devices import in_graph_safe
from grab_exp.grads.rows import keep_views
from grab_exp.per_sample.check.loss import CONTRACT, refuse_gap
from grab_exp.per_sample.check.tolerance import LOSS_TOLERANCE, tolerance
from grab_exp.per_sample.modules import LossContractError, UnsupportedModelError

#: the default schedule: calls 1, 2, 4, ..., 128, then every 128th (and every new structure)
CHECK_EVERY = 128
#: structure keys remembered (a run with more distinct batches checks on schedule only)
MAX_KEYS = 4096
SEED = 0x9E3779B9
#: examples the mixing check runs alone, each a forward of its own, on a checked call
ALONE = 64


class Check:
    """When to check (``every``: the period, ``0``: never), and what the checks found so far:
    ``calls``, ``checks``, and ``pending`` while no batch of 2 or more examples was checked."""

    def __init__(self, every: int = CHECK_EVERY) -> None:
        self.every, self.calls, self.checks, self.pending = every, 0, 0, True
        self._seen: set = set()
        self._gap: torch.Tensor | None = None  # CUDA: the loss split's largest gap, read later
        self._rows: torch.Tensor | None = None  # CUDA: the rows' worst gap / tolerance, later
        self._scratch: torch.Tensor | None = None  # (d,): the rows' mean check's, kept

    @property
    def on(self) -> bool:
        return self.every > 0

    def due(self, key: Any, batch: int) -> bool:
        """Count a call; whether its batch is checked in full: calls 1, 2, 4, ... up to
        ``every``, then every ``every``-th, a new ``key``, the first batch of 2 or more."""
        if not self.on or in_graph_safe():
            return False
        self.calls = n = self.calls + 1
        scheduled = n % self.every == 0 or (n & (n - 1) == 0 and n < self.every)
        return scheduled or key not in self._seen or (self.pending and batch >= 2)

    def passed(self, key: Any, batch: int) -> None:
        self.checks += 1
        if len(self._seen) < MAX_KEYS:
            self._seen.add(key)
        self.pending = self.pending and batch < 2

    def forget(self) -> None:
        self._seen.clear()

    def scratch(self, width: int, like: torch.Tensor) -> torch.Tensor:
        """A ``(width,)`` vector like ``like``, kept (a new one would be new pages each call)."""
        s = self._scratch
        if s is None or s.numel() != width or s.dtype != like.dtype or s.device != like.device:
            s = self._scratch = keep_views(like.new_empty(width))  # its views made once too
        return s

    def weights(self, batch: int, like: torch.Tensor) -> torch.Tensor:
        """The check's weights ``c (B,)``: ``0.5 + k/B`` in an order drawn from a generator of its
        own: positive (nothing cancels), ``1/B`` apart (rows swapped between two examples show)."""
        generator = torch.Generator().manual_seed(SEED + self.checks)
        order = torch.randperm(batch, generator=generator).to(torch.float64)
        return (0.5 + order / batch).to(device=like.device, dtype=like.dtype)

    def split(self, batch: int) -> int | None:
        """Where this call's loss is split in two (:class:`.loss.OutputSplit`), moving from call
        to call; ``None`` for ``B < 2``, with the check off, or in a captured step."""
        if batch < 2 or not self.on or in_graph_safe():
            return None
        return 1 + self.calls % (batch - 1)

    def groups(self, batch: int) -> list[list[int]]:
        """The examples the mixing check runs each alone: all, or :data:`ALONE` drawn (a model
        may mix a few examples only, or two with each other: ``x.flip(0)`` mixup)."""
        if batch <= ALONE:
            return [[i] for i in range(batch)]
        generator = torch.Generator().manual_seed(SEED + 1 + self.checks)
        return [[i] for i in torch.randperm(batch, generator=generator)[:ALONE].tolist()]

    def settle_gap(self, gap: float | torch.Tensor | None, dtype: torch.dtype) -> None:
        """Refuse a loss whose two parts do not add up to it: at once on the CPU; on CUDA (no
        host read inside a step) at the next full check (:meth:`settle_deferred`)."""
        if isinstance(gap, torch.Tensor):  # over its dtype's tolerance (calls' dtypes differ)
            ratio = gap / tolerance(LOSS_TOLERANCE, dtype)
            self._gap = ratio if self._gap is None else torch.maximum(self._gap, ratio)  # NaN stays
        elif gap is not None:
            refuse_gap(gap, dtype)

    def defer_rows(self, ratio: torch.Tensor) -> None:
        """Keep a call's rows' gap (``()``, over its tolerance) for the next full check."""
        self._rows = ratio if self._rows is None else torch.maximum(self._rows, ratio)

    def settle_deferred(self) -> None:
        """Refuse what the loss splits and rows' gaps kept on the device showed (a read each)."""
        if self._rows is not None:
            ratio, self._rows = self._rows.item(), None
            if not ratio <= 1:
                raise UnsupportedModelError(
                    f"the rows' mean differed from autograd's gradient on a call since the last "
                    f"check ({ratio:.2g} times the tolerance); use method=func"
                )
        if self._gap is not None:
            ratio, self._gap = self._gap.item(), None
            if not ratio <= 1:  # NaN too
                raise LossContractError(
                    f"loss_fn of a batch since the last check is not the mean of its two parts' "
                    f"losses ({ratio:.2g} times the tolerance of their values' or their gradients' "
                    f"gap): {CONTRACT}"
                )
