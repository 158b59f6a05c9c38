"""Pair balance: CD-GraB's pair balance on one worker (Cooper et al., 2023)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from grab_exp.balance.base import Work
from grab_exp.balance.gradient import GradientOrdering
from grab_exp.balance.signs import pair_keys, sequential_signs
from grab_exp.grads.rows import GradRows

#: a captured step made for one lead, replayed after an odd-sized step changed it
LEAD_CHANGED = (
    "step: pair balance replayed a captured step after an odd-sized step changed which example "
    "leads its pairs; capture steps of an even size only, and step no odd-sized batch between "
    "their replays"
)


class PairBalance(GradientOrdering):
    """``pair``: consecutive visited examples form pairs; their difference is balanced.

    ``v = g_first - g_second``, ``s = sign(v, acc)``, ``acc += s v``; on ``+`` the
    first goes to the positives and the second to the negatives, on ``-`` the
    reverse. A pair may straddle two mini-batches; an unpaired last example joins
    the positives. No stale mean.

    Whether the pending example of earlier steps leads a step's pairs is the parity of the rows
    stepped so far in the epoch. The host counts it (``_lead``: the number of pairs, and of
    kernel draws, depends on it); steps of an even size leave it unchanged, so a captured one
    stays right at every replay. The device keeps it too (``lead``), written by odd-sized steps
    and checked by every step: a captured step replayed after an odd-sized one changed it is
    refused, not run wrong.
    """

    name = "pair"
    state_tensors = ("acc", "pending")

    @classmethod
    def capture_batch_sizes(cls, batch_size: int) -> str | None:
        if batch_size % 2:
            return "an even number (an odd one changes the number of pairs from step to step)"
        return None

    def _init_state(self) -> None:
        self.acc = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)
        self.pending = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (dim,)
        self.lead = torch.zeros((), dtype=torch.long, device=self.device)  # 1: pending leads
        self._lead = 0  # the same, on the host

    def _refuse_step(self, rows: int) -> None:
        self._index_check.refuse(torch.ne(self.lead, self._lead), LEAD_CHANGED)

    def _balance_work(self, rows: int, dim: int, size: int) -> Work:
        """Per pair a difference, a dot product and an update (``rows / 2`` pairs, 5 flops a
        value of a pair); the accumulator and the pending row read and written once."""
        return Work(4 * dim * size, 5 * rows * dim // 2)

    def _balance(self, grads: GradRows, positions: torch.Tensor) -> None:
        rows, lead = grads.rows, self._lead
        pairs = (rows + lead) // 2
        if pairs:
            first = self.pending if lead else None
            diffs = grads.pair_diffs(first, lambda r: self._scratch("diffs", r))  # P rows
            members = positions  # (2P,) visit positions of the pairs' members
            if lead or rows % 2:
                members = self._visit_positions(2 * pairs, back=lead)
            self._balance_pairs(self._prepare(diffs), members)
        if rows % 2:
            self._lead = 1 - lead
            self.lead.fill_(self._lead)
        if self._lead:
            grads.write_row(rows - 1, self.pending)

    def _balance_pairs(self, diffs: GradRows, members: torch.Tensor) -> None:
        dots = diffs.dots(self.acc)  # (P,)
        signs = sequential_signs(dots, diffs.gram(), self._thresholds(len(dots)))  # (P,)
        diffs.accumulate(self.acc, signs)
        self.keys.index_copy_(0, members, pair_keys(members, signs, self.n))

    def _end_epoch(self) -> None:
        if self._lead:  # the unpaired last example joins the positives
            self.keys[self.pos - 1] = self.pos - 1
        self._lead = 0
        self.lead.zero_()
        self.acc.zero_()

    def _extra_state(self) -> dict[str, Any]:
        return {"has_pending": bool(self._lead)}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self._lead = int(bool(state["has_pending"]))
        self.lead.fill_(self._lead)
