"""Random reshuffling: a fresh seeded permutation every epoch."""

from __future__ import annotations

import torch

from grab_exp.balance.base import Ordering


class RandomReshuffle(Ordering):
    """``rr``: every epoch a new permutation from the seeded generator (no gradients)."""

    name = "rr"

    def _next_order(self) -> torch.Tensor:
        return self._random_order()
