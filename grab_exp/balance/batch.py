"""Batch balance: mean balance with the accumulator frozen inside a mini-batch."""

from __future__ import annotations

import torch

from grab_exp.balance.centered import CenteredBalance
from grab_exp.balance.kernels import signs_from
from grab_exp.balance.signs import sign_keys
from grab_exp.grads.rows import GradRows


class BatchBalance(CenteredBalance):
    """``batch``: ``s_i = sign(v_i, acc_start)`` for the whole mini-batch, then
    ``acc += sum_i s_i v_i`` with the centered ``v_i = g_i - m``.
    """

    name = "batch"

    def _balance(self, grads: GradRows, positions: torch.Tensor) -> None:
        centered = self._center(grads)  # B rows
        signs = signs_from(centered.dots(self.acc), self._thresholds(centered.rows))  # (B,)
        self._accumulate(centered, signs, grads)
        self.keys.index_copy_(0, positions, sign_keys(positions, signs, self.n))
