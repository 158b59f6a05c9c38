"""Recursive balance: a binary tree of accumulators, each example balanced D+1 times."""

from __future__ import annotations

import numpy
import torch

from grab_exp.balance.base import Work
from grab_exp.balance.centered import CenteredBalance
from grab_exp.balance.signs import host_signs, sequential_signs, sign_keys
from grab_exp.balance.tensors import counting
from grab_exp.devices import host_reads_allowed
from grab_exp.grads.rows import GradRows, constant, kept_view
from grab_exp.validation import check_int_at_least


def node_accumulators(nodes: int, dim: int, dtype: torch.dtype, device) -> torch.Tensor:
    """``(nodes, dim)`` zeros, node-major: a level's nodes are consecutive rows (one GEMM reads
    them), and a node's row is contiguous (a gather copies whole rows)."""
    return torch.zeros(nodes, dim, dtype=dtype, device=device)


class RecursiveBalance(CenteredBalance):
    """``recursive``: a complete binary tree of depth ``D`` with one accumulator per node.

    Every centered example ``v = g - m`` starts at the root; at each node it visits,
    ``s = sign(v, acc_node)``, ``acc_node += s v`` and it moves left on ``+``, right
    on ``-``. At a leaf (level ``D``) the same sign makes it a positive or negative
    of that leaf. Next order: leaves left to right; inside a leaf positives in
    visit order, negatives in reverse. ``D = 0`` is mean balance.

    Nodes are stored in heap order: root 0, children of ``i`` at ``2i+1`` (left)
    and ``2i+2`` (right); ``self.acc`` has shape ``(2^(D+1) - 1, d)``.

    A batch visits every node at one level only, so each example is signed against its node's
    accumulator as it stood before the batch plus the earlier same-node examples of the batch
    (the masked Gram matrix). Two exact, deterministic ways to read and update the nodes:

    * **block** (the first ``L`` levels, those with at most ``B`` nodes): the dots with all their
      ``2^L - 1`` nodes come from one product before the batch, and the updates are summed in one
      product after it (``coef``: each example's sign at the node it visited);
    * **gather** (deeper levels): the ``B`` visited nodes' rows are gathered, each example's dot
      is taken with its own node's row, the same-node sums come from one product with the
      ``(B, B)`` same-node matrix, and the rows go back with one write per node: a node's first
      example writes its row, a repeated node's later examples all write to one spare row after
      the nodes (never read: which of them lands there does not matter).

    So a step costs about ``2 (2^L - 1) B d`` for the block levels and ``2 B^2 d`` (two ``B x B x
    d`` products) per gather level: linear in ``D``, not ``2^(D+1) B d``. Neither needs an
    atomic scatter, whose repeated indices add in a varying order on CUDA, nor a host read. The
    centered rows are written from the factors in one pass, and their Gram matrix comes from the
    factors' (as mean balance's does: ``G Gᵀ`` and the dots with the mean).
    """

    name = "recursive"

    def __init__(self, n: int, d: int, *, depth: int = 5, **kwargs) -> None:
        check_int_at_least("balance.depth", depth, 0)
        self.depth = depth
        super().__init__(n, d, **kwargs)

    def _balance_work(self, rows: int, dim: int, size: int) -> Work:
        """Mean balance's work at each of the ``D + 1`` levels (a dot product and an update per
        row), each level's visited nodes (at most ``min(2^l, rows)``) read and written once,
        the centering and the raw sum once."""
        levels = self.depth + 1
        nodes = sum(min(2**level, rows) for level in range(levels))
        return Work((3 + 2 * nodes) * dim * size, (2 + 4 * levels) * rows * dim)

    def _new_acc(self, vector: torch.Tensor) -> torch.Tensor:
        nodes = 2 ** (self.depth + 1) - 1
        # the nodes, then the spare row of the gather levels (scratch: not in the state)
        self._nodes_and_spare = node_accumulators(nodes + 1, self.dim, self.dtype, self.device)
        return self._nodes_and_spare[:nodes]

    def _balance(self, grads: GradRows, positions: torch.Tensor) -> None:
        self._sum_raw(grads)
        centered = self._center(grads, materialize=True)  # (B, dim) rows
        rows = centered.rows
        gram = centered.gram()  # (B, B)
        # example-major draws: the same thresholds however an epoch is split into steps
        thresholds = self._thresholds(rows * (self.depth + 1)).view(rows, self.depth + 1).T
        block_levels = min(self.depth + 1, rows.bit_length())  # levels of at most `rows` nodes
        nodes = 2**block_levels - 1
        block = kept_view(self.acc, nodes, lambda: self.acc[:nodes])  # (S, dim): block levels
        node_dots = centered.dots(block)  # (B, S) <v_i, acc_k> before this batch
        coef = torch.zeros_like(node_dots)  # (B, S): acc_k += sum_i coef_ik v_i
        walk = self._host_block_levels if host_reads_allowed(self.device) else self._block_levels
        node, signs = walk(node_dots, gram, thresholds, coef, block_levels)  # (B,) each
        for level in range(block_levels, self.depth + 1):
            same_node = node[:, None] == node[None, :]  # (B, B)
            signs = self._gathered_level(centered, gram, same_node, node, thresholds[level])
            if level < self.depth:
                node = self._children(node, signs)
        centered.accumulate(block, coef)  # one product: a fixed order of sums, any device
        leaf = node - (2**self.depth - 1)  # (B,)
        keys = leaf * (2 * self.n) + sign_keys(positions, signs, self.n)  # (B,)
        self.keys.index_copy_(0, positions, keys)

    def _block_levels(self, node_dots, gram, thresholds, coef, levels: int):
        """Sign the first ``levels`` (block) levels from ``node_dots (B, S)``, their signs written
        into ``coef (B, S)``; returns each example's node after them and the last level's signs,
        ``(B,)`` each."""
        node = torch.zeros(len(node_dots), dtype=torch.long, device=self.device)  # heap index
        for level in range(levels):
            same_node = node[:, None] == node[None, :]  # (B, B)
            dots = node_dots.gather(1, node[:, None])[:, 0]  # (B,) <v_i, acc_node(i)>
            signs = sequential_signs(dots, gram * same_node, thresholds[level])  # (B,)
            coef.scatter_(1, node[:, None], signs[:, None])
            if level < self.depth:
                node = self._children(node, signs)
        return node, signs

    def _host_block_levels(self, node_dots, gram, thresholds, coef, levels: int):
        """:meth:`_block_levels` on the CPU through numpy on the tensors' own memory (``coef``
        written in place): the same masked Gram matrices and sign recursions, so the same signs
        and nodes bit for bit, without some ten operator launches a level."""
        dots_of, grams, limits = node_dots.numpy(), gram.numpy(), thresholds.numpy()
        weights = coef.numpy()  # (B, S)
        every = numpy.arange(len(dots_of))  # (B,)
        node = numpy.zeros(len(dots_of), dtype=numpy.int64)  # (B,) heap index
        for level in range(levels):
            same_node = node[:, None] == node[None, :]  # (B, B)
            signs = host_signs(dots_of[every, node], grams * same_node, limits[level])  # (B,)
            weights[every, node] = signs
            if level < self.depth:  # the left child on +, the right one on -
                node = 2 * node + numpy.where(signs > 0, 1, 2)
        return torch.from_numpy(node), torch.from_numpy(signs)

    def _children(self, node: torch.Tensor, signs: torch.Tensor) -> torch.Tensor:
        """The next level's nodes ``(B,)``: the left child on ``+``, the right one on ``-``."""
        left, right = (constant(k, 1, torch.long, self.device) for k in (1, 2))  # child offsets
        return 2 * node + torch.where(signs > 0, left, right)

    def _gathered_level(self, centered, gram, same_node, node, thresholds) -> torch.Tensor:
        """Sign and apply one gather level: ``node (B,)`` the visited nodes; returns ``(B,)``."""
        visited = self._scratch("visited", centered.rows)  # (B, dim)
        torch.index_select(self.acc, 0, node, out=visited)  # row i: acc of example i's node
        dots = centered.dots(visited).diagonal()  # (B,) <v_i, acc_node(i)>
        signs = sequential_signs(dots, gram * same_node, thresholds)  # (B,)
        centered.accumulate(visited, same_node * signs[:, None])  # row i += its node's sum
        first = same_node.to(torch.uint8).argmax(dim=1)  # (B,) the node's first example
        spare = constant(len(self.acc), 1, torch.long, self.device)  # (1,) the spare row
        target = torch.where(first == counting(centered.rows, self.device), node, spare)  # (B,)
        self._nodes_and_spare.index_copy_(0, target, visited)  # each node once, repeats spare
        return signs
