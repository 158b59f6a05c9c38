"""Mean balance: vanilla GraB (Lu et al., 2022)."""

from __future__ import annotations

import torch

from grab_exp.balance.centered import CenteredBalance
from grab_exp.balance.signs import sequential_signs, sign_keys


class MeanBalance(CenteredBalance):
    """``mean``: each centered gradient is signed against the running accumulator.

    For each visited example: ``v = g - m``, ``s = sign(v, acc)``, ``acc += s v``.
    Next order: ``+`` examples in visit order, then ``-`` ones in reverse.
    """

    name = "mean"

    def _balance(self, grads: torch.Tensor, start: int) -> None:
        centered = self._center(grads)  # (B, d)
        dots = centered @ self.acc  # (B,)
        gram = centered @ centered.T  # (B, B)
        signs = sequential_signs(dots, gram, self._thresholds(len(dots)))  # (B,)
        self.acc.addmv_(centered.T, signs)
        positions = torch.arange(start, start + len(dots), device=self.device)
        self.keys[start : start + len(dots)] = sign_keys(positions, signs, self.n)
