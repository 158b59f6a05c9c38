"""Pair balance: CD-GraB's pair balance on one worker (Cooper et al., 2023)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from grab_exp.balance.base import Ordering
from grab_exp.balance.signs import pair_keys, sequential_signs
from grab_exp.balance.tensors import counting
from grab_exp.grads.rows import GradRows


class PairBalance(Ordering):
    """``pair``: consecutive visited examples form pairs; their difference is balanced.

    ``v = g_first - g_second``, ``s = sign(v, acc)``, ``acc += s v``; on ``+`` the
    first goes to the positives and the second to the negatives, on ``-`` the
    reverse. A pair may straddle two mini-batches; an unpaired last example joins
    the positives. No stale mean.

    Whether a pending example leads a step's pairs is the device flag ``lead``. A step of an
    even number of rows makes ``B / 2`` pairs either way and reads it only on the device; an odd
    one (the epoch's last, or any of an odd batch size) reads it on the host, since the number
    of pairs and of kernel draws depends on it.
    """

    name = "pair"
    state_tensors = ("acc", "pending")

    def _init_state(self) -> None:
        self.acc = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)
        self.pending = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)
        self.lead = torch.zeros((), dtype=torch.long, device=self.device)  # 1: pending leads

    @classmethod
    def capture_batch_sizes(cls, batch_size: int) -> str | None:
        if batch_size % 2:
            return "an even number (an odd one changes the number of pairs from step to step)"
        return None

    def _balance(self, grads: GradRows, positions: torch.Tensor) -> None:
        rows = grads.rows
        lead = int(self.lead) if rows % 2 else self.lead  # a host read for odd steps alone
        pairs = (rows + 1) // 2 if rows % 2 and lead else rows // 2
        if pairs:
            diffs = grads.pair_diffs(self.pending, lead, lambda r: self._scratch("diffs", r))
            members = torch.add(counting(2 * pairs, self.device), self.position - lead)  # (2P,)
            self._balance_pairs(self._prepare(diffs), members.clamp_(max=self.n - 1))
        if rows % 2:
            self.lead.fill_(1 - lead)
        grads.write_row(rows - 1, self.pending)  # read only while it leads

    def _balance_pairs(self, diffs: GradRows, members: torch.Tensor) -> None:
        dots = diffs.dots(self.acc)  # (P,)
        signs = sequential_signs(dots, diffs.gram(), self._thresholds(len(dots)))  # (P,)
        diffs.accumulate(self.acc, signs)
        self.keys.index_copy_(0, members, pair_keys(members, signs, self.n))

    def _end_epoch(self) -> None:
        if int(self.lead):  # the unpaired last example joins the positives
            self.keys[self.pos - 1] = self.pos - 1
        self.lead.zero_()
        self.acc.zero_()

    def _extra_state(self) -> dict[str, Any]:
        return {"has_pending": bool(self.lead)}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.lead.fill_(int(bool(state["has_pending"])))
