"""Recursive pair balance: pair balance down a tree inside every mini-batch."""

from __future__ import annotations

import functools

import numpy
import torch

from grab_exp.balance.base import Work
from grab_exp.balance.gradient import GradientOrdering
from grab_exp.balance.kernels import signs_from
from grab_exp.balance.recursive import node_accumulators
from grab_exp.balance.signs import UNBALANCED_KEY
from grab_exp.devices import host_reads_allowed
from grab_exp.grads.rows import GradRows, inverse_norms
from grab_exp.validation import check_power_of_two


class RecursivePairBalance(GradientOrdering):
    """``recursive_pair``: per mini-batch of ``b`` (a power of two), recursively pair.

    At a node, a group's consecutive members are paired, every pair difference is
    signed against the node's accumulator as it stood before this group, the
    accumulator gains ``sum_k s_k v_k``, and the group splits: the left subgroup
    takes the first member on ``+`` (second on ``-``), the right one the other;
    they recurse into the node's left and right children. The ``b - 1`` node
    accumulators live for the epoch. Next order: for position ``p = 0 .. b-1`` the
    example at ``p`` of every mini-batch, in visit order for even ``p`` and reversed
    for odd ``p``; a final partial mini-batch is appended unbalanced.
    """

    name = "recursive_pair"
    state_tensors = ("acc",)

    def __init__(self, n: int, d: int, *, batch_size: int, **kwargs) -> None:
        check_power_of_two("balance.batch_size", batch_size)
        self.batch_size = batch_size
        self.levels = batch_size.bit_length() - 1
        self.batches_max = -(-n // batch_size)  # an upper bound on full mini-batches
        super().__init__(n, d, **kwargs)

    def _init_state(self) -> None:
        nodes = self.batch_size - 1  # heap-ordered, log2(b) levels
        self.acc = node_accumulators(nodes, self.dim, self.dtype, self.device)  # (nodes, dim)
        slot = torch.arange(self.batch_size, device=self.device)  # position p inside the batch
        self._even_slots = slot % 2 == 0  # (b,)
        self._slot_keys = slot * self.batches_max  # (b,)

    def _balance_work(self, rows: int, dim: int, size: int) -> Work:
        """Pair balance at each of the ``log2 b`` levels (``rows / 2`` pairs a level: a
        difference, a dot product and an update), the ``b - 1`` nodes read and written once."""
        nodes = self.batch_size - 1
        return Work(2 * nodes * dim * size, self.levels * 5 * rows * dim // 2)

    def _balance(self, grads: GradRows, positions: torch.Tensor) -> None:
        rows = grads.rows
        if rows != self.batch_size:  # the epoch's last, checked in _check_rows
            self.keys.index_copy_(0, positions, UNBALANCED_KEY + positions)
            return
        node_dots = grads.dots(self.acc)  # (b, b-1): <g_j, acc_k>
        gram = grads.gram() if self.normalize else None  # (b, b)
        coef = node_dots.new_zeros(rows, self.batch_size - 1)  # (b, b-1): acc_k += sum c_jk g_j
        if host_reads_allowed(self.device):
            arrangement = self._host_levels(node_dots, gram, coef)
        else:
            arrangement = torch.arange(rows, device=self.device)  # (b,) members by position
            for level in range(self.levels):
                arrangement = self._split_level(node_dots, gram, coef, arrangement, level)
        grads.accumulate(self.acc, coef)
        batch = torch.div(self.position, self.batch_size, rounding_mode="floor")  # ()
        keys = torch.where(self._even_slots, batch, self.batches_max - 1 - batch)  # (b,)
        keys += self._slot_keys  # p * batches_max at slot p
        self.keys.index_copy_(0, positions.index_select(0, arrangement), keys)

    def _refuse_step(self, rows: int) -> None:
        if rows != self.batch_size:  # only the epoch's last batch may be shorter
            message = (
                f"step: recursive_pair needs mini-batches of balance.batch_size="
                f"{self.batch_size} (only the epoch's last may be smaller)"
            )
            self._index_check.refuse(torch.ne(self.position, self.n - rows), message)

    def _split_level(self, node_dots, gram, coef, arrangement, level: int) -> torch.Tensor:
        """Balance every group of one level; return the arrangement after the split.

        Every pair of a level is signed against its node's accumulator as it stood before
        the batch (no node is visited twice in one batch), so all dot products come from
        ``node_dots`` and the updates are collected in ``coef`` for one final ``addmm``.
        """
        first, second = _pairs(arrangement, level)  # (b/2,) each
        node = _level_nodes(2**level, len(first) // 2**level, self.device)  # (b/2,)
        dots = node_dots[first, node] - node_dots[second, node]  # (b/2,) <g_f - g_s, acc>
        if gram is None:
            signs = weighted = signs_from(dots, self._thresholds(len(dots)))  # (b/2,)
        else:  # normalize: v / |v| with |v|^2 from the Gram matrix
            norm_sq = gram[first, first] + gram[second, second] - 2 * gram[first, second]
            sizes = (
                gram[first, first].clamp_min(0).sqrt() + gram[second, second].clamp_min(0).sqrt()
            )
            weight = inverse_norms(norm_sq, sizes)  # (b/2,)
            signs = signs_from(dots * weight, self._thresholds(len(dots)))  # (b/2,)
            weighted = signs * weight
        return _split(torch, coef, (first, second, node), signs, weighted, level)

    def _host_levels(self, node_dots, gram, coef) -> torch.Tensor:
        """:meth:`_split_level` for every level at once on the CPU, through numpy on the
        tensors' own memory (``coef`` is written in place; no device to wait for): the same
        differences, products and comparisons in the same precision, so the same signs, weights
        and arrangement bit for bit, without some fifteen operator launches a level."""
        dots_of, weights_of = node_dots.numpy(), coef.numpy()  # (b, b-1) each
        grams = None if gram is None else gram.numpy()  # (b, b)
        arrangement = numpy.arange(self.batch_size)  # (b,) members by position
        for level in range(self.levels):
            first, second = _pairs(arrangement, level)  # (b/2,) each
            node = _level_nodes(2**level, len(first) // 2**level, self.device).numpy()
            dots = dots_of[first, node] - dots_of[second, node]  # (b/2,)
            limits = self._thresholds(len(dots)).numpy()  # (b/2,)
            if grams is None:
                signs = weighted = numpy.where(dots < limits, 1.0, -1.0).astype(dots.dtype)
            else:
                norm_sq = grams[first, first] + grams[second, second] - 2 * grams[first, second]
                sizes = numpy.sqrt(grams[first, first].clip(0)) + numpy.sqrt(
                    grams[second, second].clip(0)
                )
                weight = inverse_norms(*map(torch.from_numpy, (norm_sq, sizes))).numpy()  # (b/2,)
                signs = numpy.where(dots * weight < limits, 1.0, -1.0).astype(dots.dtype)
                weighted = signs * weight
            members = (first, second, node)
            arrangement = _split(numpy, weights_of, members, signs, weighted, level)
        return torch.from_numpy(arrangement)

    def _end_epoch(self) -> None:
        self.acc.zero_()


def _pairs(arrangement, level: int):
    """The first and second members ``(b/2,)`` of the pairs of a level's groups, group after
    group (a torch tensor or a numpy array, as ``arrangement (b,)``)."""
    pairs = arrangement.reshape(2**level, -1, 2)  # (groups, pairs per group, 2)
    return pairs[..., 0].reshape(-1), pairs[..., 1].reshape(-1)


def _split(xp, coef, members, signs, weighted, level: int):
    """Write the pairs' weights into ``coef`` (``+`` at the first member's node column, ``-`` at
    the second's) and return the arrangement ``(b,)`` after the split: each of the level's
    groups' winners (the first member on ``+``), then its losers. ``xp``: ``torch`` or
    ``numpy``, as the arrays."""
    first, second, node = members
    coef[first, node] = weighted
    coef[second, node] = -weighted
    plus = signs > 0
    winners = xp.where(plus, first, second).reshape(2**level, -1)
    losers = xp.where(plus, second, first).reshape(2**level, -1)
    return xp.concatenate([winners, losers], axis=1).reshape(-1)


@functools.cache
def _level_nodes(groups: int, pairs: int, device: torch.device) -> torch.Tensor:
    """``(groups * pairs,)`` heap index of each pair's node at the level of ``groups`` nodes."""
    return (groups - 1) + torch.arange(groups, device=device).repeat_interleave(pairs)
