"""Shared base of the variants that center gradients with a stale mean."""

from __future__ import annotations

import torch

from grab_exp.balance.base import Work
from grab_exp.balance.gradient import GradientOrdering
from grab_exp.grads.rows import DenseRows, GradRows, constant, keep_views


class CenteredBalance(GradientOrdering):
    """Balances ``v = g - m``, ``m`` the mean raw gradient of the previous epoch.

    In the first epoch ``m = 0``. If an epoch steps no example, ``m`` is kept.
    A subclass returns its accumulator(s) from ``_new_acc`` (by default the vector ``acc``, the
    row between the stale mean and the raw sum, so that factored gradients are read once for
    their dots with both and once for both sums: :meth:`GradRows.dots_after_base`,
    :meth:`GradRows.accumulate_and_sum`). Each step it calls ``_center`` for the centered rows
    and records the raw rows exactly once: through ``_accumulate`` (a vector accumulator) or
    ``_sum_raw`` (any other).
    """

    state_tensors = ("acc", "stale_mean", "grad_sum")

    def _init_state(self) -> None:
        rows = torch.zeros(3, self.dim, dtype=self.dtype, device=self.device)  # (3, dim)
        self._mean_and_acc = keep_views(rows[:2])  # (2, dim)
        self._acc_and_sum = keep_views(rows[1:])  # (2, dim)
        self.stale_mean, vector, self.grad_sum = rows.unbind()  # (dim,) each
        self.acc = self._new_acc(vector)

    def _new_acc(self, vector: torch.Tensor) -> torch.Tensor:
        """The accumulator(s): ``vector``, the zero ``(dim,)`` row after the stale mean."""
        return vector

    def _balance_work(self, rows: int, dim: int, size: int) -> Work:
        """The accumulator's work, the centering (a subtraction a value) and the raw rows' sum
        for the next mean (an addition a value; the stale mean read, the sum read and
        written)."""
        return super()._balance_work(rows, dim, size) + Work(3 * dim * size, 2 * rows * dim)

    def _acc_dots(self, centered: GradRows) -> torch.Tensor:
        """``<v_i, acc>`` ``(B,)`` of a vector accumulator."""
        return centered.dots_after_base(self._mean_and_acc)

    def _accumulate(self, centered: GradRows, signs: torch.Tensor, grads: GradRows) -> None:
        """``acc += sum_i s_i v_i`` of a vector accumulator, and the raw rows into the next
        mean's sum (one pass over factored rows for both)."""
        centered.accumulate_and_sum(self._acc_and_sum, signs, grads)

    def _sum_raw(self, grads: GradRows) -> None:
        """Record the raw ``B`` rows for the next mean."""
        grads.accumulate(self.grad_sum, constant(1.0, grads.rows, self.dtype, self.device))

    def _center(self, grads: GradRows, materialize: bool = False) -> GradRows:
        """The centered (prepared) rows ``g_i - m``, written into a ``(B, dim)`` matrix if
        ``materialize`` (else lazy where they are). The raw rows are not recorded here."""
        scratch = lambda rows: self._scratch("centered", rows)  # noqa: E731
        if not materialize:
            return self._prepare(grads.centered(self.stale_mean, scratch))
        # factors give the centered Gram matrix cheaply (from G Gᵀ, lazily), the matrix does not
        gram = grads.centered(self.stale_mean, scratch).gram() if grads.factored else None
        matrix = grads.centered_into(self.stale_mean, scratch(grads.rows)).matrix  # (B, dim)
        return self._prepare(DenseRows(matrix, gram))

    def _end_epoch(self) -> None:
        if self.pos:
            torch.div(self.grad_sum, self.pos, out=self.stale_mean)
        self.grad_sum.zero_()
        self.acc.zero_()
