"""Shuffle once: one seeded permutation, kept for every epoch."""

from __future__ import annotations

import torch

from grab_exp.balance.base import Ordering


class ShuffleOnce(Ordering):
    """``so``: a seeded random permutation drawn once, then fixed (no gradients)."""

    name = "so"

    def _first_order(self, first_epoch: str) -> torch.Tensor:
        return self._random_order()

    def _next_order(self) -> torch.Tensor:
        return self.order
