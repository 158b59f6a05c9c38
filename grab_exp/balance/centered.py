"""Shared base of the variants that center gradients with a stale mean."""

from __future__ import annotations

import torch

from grab_exp.balance.base import Ordering
from grab_exp.grads.rows import GradRows


class CenteredBalance(Ordering):
    """Balances ``v = g - m``, ``m`` the mean raw gradient of the previous epoch.

    In the first epoch ``m = 0``. If an epoch steps no example, ``m`` is kept.
    Subclasses allocate their accumulator(s) as ``self.acc`` and call ``_center``.
    """

    state_tensors = ("acc", "stale_mean", "grad_sum")

    def _init_state(self) -> None:
        self.stale_mean = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)
        self.grad_sum = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)
        self.acc = self._new_acc()

    def _new_acc(self) -> torch.Tensor:
        return torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)

    def _center(self, grads: GradRows) -> GradRows:
        """Record the raw ``B`` rows for the next mean; return the centered (prepared) rows."""
        ones = torch.ones(grads.rows, dtype=self.dtype, device=self.device)  # (B,)
        grads.accumulate(self.grad_sum, ones)
        centered = grads.centered(self.stale_mean, lambda rows: self._scratch("centered", rows))
        return self._prepare(centered)

    def _end_epoch(self) -> None:
        if self.pos:
            torch.div(self.grad_sum, self.pos, out=self.stale_mean)
        self.grad_sum.zero_()
        self.acc.zero_()
