"""Pair balance: CD-GraB's pair balance on one worker (Cooper et al., 2023)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from grab_exp.balance.base import Ordering
from grab_exp.balance.signs import pair_keys, sequential_signs
from grab_exp.grads.rows import GradRows


class PairBalance(Ordering):
    """``pair``: consecutive visited examples form pairs; their difference is balanced.

    ``v = g_first - g_second``, ``s = sign(v, acc)``, ``acc += s v``; on ``+`` the
    first goes to the positives and the second to the negatives, on ``-`` the
    reverse. A pair may straddle two mini-batches; an unpaired last example joins
    the positives. No stale mean.
    """

    name = "pair"
    state_tensors = ("acc", "pending")

    def _init_state(self) -> None:
        self.acc = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)
        self.pending = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)
        self.has_pending = False

    def _balance(self, grads: GradRows, start: int) -> None:
        lead = int(self.has_pending)  # the pending example leads the first pair
        total = grads.rows + lead
        if total >= 2:
            first = self.pending if lead else None
            diffs = grads.pair_diffs(first, lambda rows: self._scratch("diffs", rows))  # P rows
            self._balance_pairs(self._prepare(diffs), start - lead)
        self.has_pending = bool(total % 2)
        if self.has_pending:
            self.pending.copy_(grads.row(grads.rows - 1))

    def _balance_pairs(self, diffs: GradRows, start: int) -> None:
        dots = diffs.dots(self.acc)  # (P,)
        signs = sequential_signs(dots, diffs.gram(), self._thresholds(len(dots)))  # (P,)
        diffs.accumulate(self.acc, signs)
        self.keys[start : start + 2 * len(signs)] = pair_keys(start, signs, self.n)

    def _end_epoch(self) -> None:
        if self.has_pending:  # the unpaired last example joins the positives
            self.keys[self.pos - 1] = self.pos - 1
        self.has_pending = False
        self.acc.zero_()

    def _extra_state(self) -> dict[str, Any]:
        return {"has_pending": self.has_pending}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.has_pending = bool(state["has_pending"])
