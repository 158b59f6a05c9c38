"""Mean balance: vanilla GraB (Lu et al., 2022)."""

from __future__ import annotations

import torch

from grab_exp.balance.centered import CenteredBalance
from grab_exp.balance.signs import sequential_signs, sign_keys
from grab_exp.grads.rows import GradRows


class MeanBalance(CenteredBalance):
    """``mean``: each centered gradient is signed against the running accumulator.

    For each visited example: ``v = g - m``, ``s = sign(v, acc)``, ``acc += s v``.
    Next order: ``+`` examples in visit order, then ``-`` ones in reverse.
    """

    name = "mean"

    def _balance(self, grads: GradRows, positions: torch.Tensor) -> None:
        centered = self._center(grads)  # B rows
        dots = self._acc_dots(centered)  # (B,)
        gram = centered.gram()  # (B, B)
        signs = sequential_signs(dots, gram, self._thresholds(len(dots)))  # (B,)
        self._accumulate(centered, signs, grads)
        self.keys.index_copy_(0, positions, sign_keys(positions, signs, self.n))
