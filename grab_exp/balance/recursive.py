"""Recursive balance: a binary tree of accumulators, each example balanced D+1 times."""

from __future__ import annotations

import torch

from grab_exp.balance.centered import CenteredBalance
from grab_exp.balance.signs import sequential_signs, sign_keys
from grab_exp.grads.rows import GradRows
from grab_exp.validation import check_int_at_least


def node_accumulators(nodes: int, dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``(nodes, dim)`` zeros stored as the transpose of ``(dim, nodes)``: the all-node products
    (``<v_i, acc_k>`` for every node, ``acc += coefᵀ V``) then run as GEMMs over long ``dim``
    rows."""
    return torch.zeros(dim, nodes, dtype=dtype, device=device).T


class RecursiveBalance(CenteredBalance):
    """``recursive``: a complete binary tree of depth ``D`` with one accumulator per node.

    Every centered example ``v = g - m`` starts at the root; at each node it visits,
    ``s = sign(v, acc_node)``, ``acc_node += s v`` and it moves left on ``+``, right
    on ``-``. At a leaf (level ``D``) the same sign makes it a positive or negative
    of that leaf. Next order: leaves left to right; inside a leaf positives in
    visit order, negatives in reverse. ``D = 0`` is mean balance.

    Nodes are stored in heap order: root 0, children of ``i`` at ``2i+1`` (left)
    and ``2i+2`` (right); ``self.acc`` has shape ``(2^(D+1) - 1, d)``.

    A batch visits every node at most at one level, so each example's dot products with all
    nodes come from one product before the batch, the examples sharing a node see each other
    through the masked Gram matrix, and the nodes' updates are summed in one final product
    (``coef``: each example's sign at each node it visited). No ``index_add_``: its repeated
    indices add atomically on CUDA, in an order that varies between runs.
    """

    name = "recursive"
    # all-node dots and updates cost nodes x B x d in either form; as factors they are small
    # products per node and layer plus a pass for the centering: slower than one dense GEMM
    reads_factors = False

    def __init__(self, n: int, d: int, *, depth: int = 5, **kwargs) -> None:
        check_int_at_least("balance.depth", depth, 0)
        self.depth = depth
        super().__init__(n, d, **kwargs)

    def _new_acc(self) -> torch.Tensor:
        nodes = 2 ** (self.depth + 1) - 1
        return node_accumulators(nodes, self.dim, self.dtype, self.device)  # (nodes, dim)

    def _balance(self, grads: GradRows, start: int) -> None:
        centered = self._center(grads)  # B rows
        rows = centered.rows
        node_dots = centered.dots(self.acc)  # (B, nodes): <v_i, acc_k> before this batch
        gram = centered.gram()  # (B, B)
        # example-major draws: the same thresholds however an epoch is split into steps
        thresholds = self._thresholds(rows * (self.depth + 1)).view(rows, self.depth + 1).T
        coef = torch.zeros_like(node_dots)  # (B, nodes): acc_k += sum_i coef_ik v_i
        node = torch.zeros(rows, 1, dtype=torch.long, device=self.device)  # (B, 1) heap index
        for level in range(self.depth + 1):
            dots = node_dots.gather(1, node)[:, 0]  # (B,) <v_i, acc_node(i)>
            same_node = node == node.T  # (B, B)
            signs = sequential_signs(dots, gram * same_node, thresholds[level])  # (B,)
            coef.scatter_(1, node, signs[:, None])
            if level < self.depth:
                node = 2 * node + torch.where(signs[:, None] > 0, 1, 2)
        centered.accumulate(self.acc, coef)  # one product: a fixed order of sums, any device
        leaf = node[:, 0] - (2**self.depth - 1)  # (B,)
        positions = torch.arange(start, start + rows, device=self.device)
        self.keys[start : start + rows] = leaf * (2 * self.n) + sign_keys(positions, signs, self.n)
