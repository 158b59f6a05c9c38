"""Fixed order: the dataset's own order in every epoch."""

from __future__ import annotations

import torch

from grab_exp.balance.base import Ordering


class FixedOrder(Ordering):
    """``fixed``: ``0, 1, ..., n-1`` every epoch (no gradients)."""

    name = "fixed"

    def _first_order(self, first_epoch: str) -> torch.Tensor:
        return torch.arange(self.n, device=self.device)

    def _next_order(self) -> torch.Tensor:
        return self.order
