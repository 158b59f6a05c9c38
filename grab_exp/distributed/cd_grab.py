"""``cd_grab``: coordinated distributed pair balance (Cooper et al., NeurIPS 2023).

At every step each worker forms the differences of its consecutive example pairs
(``B / 2`` of them), optionally sketched to ``k`` numbers; the workers all-gather them and
every process runs the *same* pair balance over the gathered differences with one shared
accumulator, visiting them pair-major: first pair of rank 0, first pair of rank 1, ..., first
pair of rank ``W - 1``, then the second pairs, and so on. A ``+`` sends the pair's first
example to the front (positives, visit order) and its second to the back (negatives,
reverse visit order) of its own worker's next order; ``-`` does the reverse. All processes
hold bitwise-identical balancing state (accumulator, kernel generator); each keeps the next
orders of its own workers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from grab_exp.balance import GradientOrdering
from grab_exp.balance.signs import pair_keys, sequential_signs
from grab_exp.distributed.orderings import DistributedOrdering
from grab_exp.grads.rows import normalize_rows


class CoordinatedGraB(DistributedOrdering, GradientOrdering):
    """``cd_grab``. Options beyond :class:`DistributedOrdering`'s:

    Args:
        kernel: ``deterministic`` | ``probabilistic`` (thresholds from the ordering's
            generator, seeded with ``seed`` on every process, so all draw the same).
        c: the probabilistic kernel's scale.
        normalize: scale every pair difference to unit norm before sketching.
        projection_dim: ``None`` (send ``d`` values per pair) or ``k`` (send a seeded
            ``k``-dimensional sketch of each difference; ``R`` from its own random stream,
            as for every ordering).
        projection_kind, projection_block_rows: ``R``'s entries and rows generated at once.
        dtype: dtype of the balancing state and of what is sent.
    """

    name = "cd_grab"
    state_tensors = ("acc",)

    def _init_state(self) -> None:
        self.acc = torch.zeros(self.dim, dtype=self.dtype, device=self.device)  # (k,)
        self.lane_index = torch.tensor(self.ranks, device=self.device)  # (L,)

    def _balance(self, grads: torch.Tensor, positions: torch.Tensor) -> None:
        rows = grads.shape[1]
        pairs = rows // 2
        local = self._pair_vectors(grads[:, 0 : 2 * pairs].to(self.dtype))  # (L, P, k)
        gathered = self.comm.all_gather(local, name="cd_grab pair differences")  # (W, P, k)
        signs = self._sign_pair_major(gathered).index_select(0, self.lane_index)  # (L, P)
        members = positions[: 2 * pairs]  # (2P,)
        self.keys.index_copy_(1, members, pair_keys(members, signs, self.m))
        if rows % 2:  # the epoch's unpaired last example joins the positives
            last = positions[rows - 1 :]  # (1,)
            self.keys.index_copy_(1, last, last.expand(len(self.ranks), 1))
        self.last_bytes_sent = pairs * self.dim * self.acc.element_size()
        self.bytes_sent += self.last_bytes_sent

    def _refuse_step(self, rows: int) -> None:
        if rows % 2:  # only the epoch's last batch may be odd
            message = "cd_grab: the per-worker batch size must be even (the epoch's last aside)"
            self._index_check.refuse(torch.ne(self.position, self.m - rows), message)

    def _pair_vectors(self, grads: torch.Tensor) -> torch.Tensor:
        """``(L, 2P, d)`` gradients -> ``(L, P, k)`` pair differences (sketched if asked).

        Each worker's rows are processed alone, with exactly the operations a real rank
        runs, so the simulator sends bitwise the same values as ``W`` processes.
        """
        diffs = grads[:, 0::2] - grads[:, 1::2]  # (L, P, d)
        return torch.stack([self._worker_vectors(diffs[lane]) for lane in range(len(diffs))])

    def _worker_vectors(self, diffs: torch.Tensor) -> torch.Tensor:
        """One worker's ``(P, d)`` differences -> ``(P, k)`` vectors to send."""
        if self.normalize:
            diffs = normalize_rows(diffs)
        return diffs if self.projection is None else self.projection(diffs)

    def _sign_pair_major(self, gathered: torch.Tensor) -> torch.Tensor:
        """Sign all ``(W, P, k)`` gathered vectors pair-major; returns ``(W, P)`` signs."""
        workers, pairs, width = gathered.shape
        vectors = gathered.transpose(0, 1).reshape(pairs * workers, width)  # (P W, k)
        dots = vectors @ self.acc  # (P W,)
        signs = sequential_signs(dots, vectors @ vectors.T, self._thresholds(len(dots)))
        self.acc.addmv_(vectors.T, signs)
        return signs.reshape(pairs, workers).T

    def _end_epoch(self) -> None:
        self.acc.zero_()

    def _extra_state(self) -> dict[str, Any]:
        return {"bytes_sent": self.bytes_sent}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        self.bytes_sent = int(state["bytes_sent"])
