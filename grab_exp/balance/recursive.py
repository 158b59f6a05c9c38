"""Recursive balance: a binary tree of accumulators, each example balanced D+1 times."""

from __future__ import annotations

import torch

from grab_exp.balance.centered import CenteredBalance
from grab_exp.balance.rows import DenseRows, GradRows
from grab_exp.balance.signs import sequential_signs, sign_keys
from grab_exp.validation import check_int_at_least


class RecursiveBalance(CenteredBalance):
    """``recursive``: a complete binary tree of depth ``D`` with one accumulator per node.

    Every centered example ``v = g - m`` starts at the root; at each node it visits,
    ``s = sign(v, acc_node)``, ``acc_node += s v`` and it moves left on ``+``, right
    on ``-``. At a leaf (level ``D``) the same sign makes it a positive or negative
    of that leaf. Next order: leaves left to right; inside a leaf positives in
    visit order, negatives in reverse. ``D = 0`` is mean balance.

    Nodes are stored in heap order: root 0, children of ``i`` at ``2i+1`` (left)
    and ``2i+2`` (right); ``self.acc`` has shape ``(2^(D+1) - 1, d)``.
    """

    name = "recursive"

    def __init__(self, n: int, d: int, *, depth: int = 5, **kwargs) -> None:
        check_int_at_least("balance.depth", depth, 0)
        self.depth = depth
        super().__init__(n, d, **kwargs)

    def _acc_shape(self) -> tuple[int, ...]:
        return (2 ** (self.depth + 1) - 1, self.dim)

    def _balance(self, grads: GradRows, start: int) -> None:
        # each example meets its own node's accumulator: rows are materialized (factors too)
        if not isinstance(grads, DenseRows):
            grads = grads.dense(self._flat_buffer(grads.rows))
        centered = self._center(grads).matrix  # (B, d)
        rows = centered.shape[0]
        gram = centered @ centered.T  # (B, B)
        # example-major draws: the same thresholds however an epoch is split into steps
        thresholds = self._thresholds(rows * (self.depth + 1)).view(rows, self.depth + 1).T
        node = torch.zeros(rows, dtype=torch.long, device=self.device)  # (B,) heap index
        for level in range(self.depth + 1):
            signs = self._balance_level(centered, gram, node, thresholds[level], level)  # (B,)
            if level < self.depth:
                node = 2 * node + torch.where(signs > 0, 1, 2)
        leaf = node - (2**self.depth - 1)  # (B,)
        positions = torch.arange(start, start + rows, device=self.device)
        self.keys[start : start + rows] = leaf * (2 * self.n) + sign_keys(positions, signs, self.n)

    def _balance_level(
        self, centered: torch.Tensor, gram: torch.Tensor, node: torch.Tensor, thresholds, level
    ) -> torch.Tensor:
        """Sign every example at its node of one tree level and update those nodes.

        The nodes' sums go through a one-hot ``(2^level, B)`` matrix product, not
        ``index_add_``: several examples share a node (the root takes the whole batch), and
        CUDA's ``index_add_`` adds repeated indices atomically, in an order that varies from
        run to run. The product sums in a fixed order: the same orders on every run.
        """
        rows = len(node)
        node_acc = torch.index_select(self.acc, 0, node, out=self._scratch("node_acc", rows))
        dots = node_acc.mul_(centered).sum(dim=1)  # (B,) row-wise <v_i, acc_node(i)>
        same_node = node[:, None] == node[None, :]  # (B, B)
        signs = sequential_signs(dots, gram * same_node, thresholds)  # (B,)
        signed = torch.mul(centered, signs[:, None], out=node_acc)  # (B, d), reuses the buffer
        first = 2**level - 1  # heap index of the level's leftmost node
        onehot = node[None, :] == torch.arange(first, 2 * first + 1, device=self.device)[:, None]
        self.acc[first : 2 * first + 1].addmm_(onehot.to(signed.dtype), signed)  # (2^level, d)
        return signs
