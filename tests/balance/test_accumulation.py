"""The rewrites for speed and determinism compute what the code before them computed:
``sequential_signs`` (numpy on the CPU, device kernels elsewhere) gives the same signs, so do
the trees' level walks (recursive's block levels and recursive_pair's, numpy on the CPU), and
recursive balance's block and gather levels (deterministic on CUDA, unlike ``index_add_`` with
repeated nodes) equal the old per-level ``index_add_`` accumulators to float64 rounding, with the
same orders."""

from __future__ import annotations

import contextlib

import pytest
import torch
from support.helpers import make, random_grads, run_epochs

from grab_exp.balance.recursive import RecursiveBalance
from grab_exp.balance.signs import device_signs, sequential_signs, sign_keys
from grab_exp.devices import graph_safe


def signs_before(dots: torch.Tensor, gram: torch.Tensor, thresholds: torch.Tensor):
    """``sequential_signs`` as it was before (commit ba11b1b): one ``torch.where`` per vector."""
    running = dots.clone()
    plus = torch.ones((), dtype=dots.dtype, device=dots.device)
    columns = gram.t().contiguous().unbind(0)
    values, limits = running.unbind(0), thresholds.unbind(0)
    signs = []
    for j in range(dots.shape[0]):
        sign = torch.where(values[j] < limits[j], plus, -plus)
        running.addcmul_(columns[j], sign)
        signs.append(sign)
    return torch.stack(signs) if signs else dots.new_zeros(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("rows", [0, 1, 7, 32])
def test_sequential_signs_are_the_signs_of_before(rows, dtype):
    generator = torch.Generator().manual_seed(rows)
    for trial in range(20):
        v = torch.randn(rows, 5, generator=generator, dtype=dtype)
        gram = v @ v.T * (torch.rand(rows, rows, generator=generator) < 0.7)  # masked, as used
        dots = torch.randn(rows, generator=generator, dtype=dtype)
        thresholds = torch.zeros(rows, dtype=dtype)
        if trial % 2:  # probabilistic thresholds
            thresholds = torch.rand(rows, generator=generator, dtype=dtype).mul_(-60).add_(30)
        if trial % 3 == 0 and rows:  # ties and signed zeros: a tie is a "-"
            dots[: rows // 2] = thresholds[: rows // 2]
            dots[0] = -0.0
        want = signs_before(dots, gram, thresholds)
        for signs in (sequential_signs, device_signs):  # the CPU's numpy loop, device kernels
            got = signs(dots, gram, thresholds)
            assert got.dtype == dtype and torch.equal(got, want)


class IndexAddRecursive(RecursiveBalance):
    """Recursive balance as it was before (commit ba11b1b): level by level, each example's node
    accumulator gathered, the nodes updated at once by ``index_add_``."""

    def _new_acc(self, vector):
        return torch.zeros(2 ** (self.depth + 1) - 1, self.dim, dtype=self.dtype)

    def _balance(self, grads, positions):
        self._sum_raw(grads)
        centered = self._center(grads).dense(self._flat_buffer(grads.rows)).matrix  # (B, d)
        rows = len(centered)
        gram = centered @ centered.T
        thresholds = self._thresholds(rows * (self.depth + 1)).view(rows, self.depth + 1).T
        node = torch.zeros(rows, dtype=torch.long)
        for level in range(self.depth + 1):
            dots = (self.acc[node] * centered).sum(dim=1)
            same_node = node[:, None] == node[None, :]
            signs = device_signs(dots, gram * same_node, thresholds[level])
            self.acc.index_add_(0, node, centered * signs[:, None])
            if level < self.depth:
                node = 2 * node + torch.where(signs > 0, 1, 2)
        leaf = node - (2**self.depth - 1)
        self.keys[positions] = leaf * (2 * self.n) + sign_keys(positions, signs, self.n)


@pytest.mark.parametrize(("n", "b", "depth"), [(40, 8, 3), (37, 16, 5), (24, 4, 0)])
def test_block_and_gather_levels_equal_index_add_to_float64_rounding(n, b, depth):
    d = 9
    zs = random_grads(n, d, epochs=2, seed=n)
    options = {"depth": depth, "dtype": "float64", "kernel": "probabilistic", "c": 3.0}
    new = make("recursive", n, d, **options)
    old = IndexAddRecursive(n, d, **options)
    assert run_epochs(new, zs, b) == run_epochs(old, zs, b)  # float64 gradients
    for bal in (new, old):  # and the accumulators mid-epoch, after a step
        bal.step(zs[0][bal.order[:b]])
    assert torch.allclose(new.acc, old.acc, rtol=1e-13, atol=1e-13)
    assert new.acc.abs().sum() > 0


def test_a_subclass_without_a_name_of_its_own_keeps_out_of_the_registry():
    from grab_exp.balance import Ordering

    assert IndexAddRecursive.name == "recursive"  # inherited
    assert Ordering.registry["recursive"] is RecursiveBalance


def _tree_epochs(bal, zs, batch: int, device_path: bool):
    """Orders and end-of-epoch accumulators, every step on the CPU's numpy level walk or, inside
    ``graph_safe``, on the device path (the operators a CUDA step launches)."""
    seen = []
    for z in zs:
        for start in range(0, bal.n, batch):
            idx = bal.order[start : start + batch]
            with graph_safe() if device_path else contextlib.nullcontext():
                bal.step(z[idx].to(bal.dtype), idx)
        seen.append(bal.acc.clone())
        bal.set_epoch(bal.epoch + 1)
        seen.append(bal.order.clone())
    return seen


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("kernel", ["deterministic", "probabilistic"])
@pytest.mark.parametrize("name", ["recursive", "recursive_pair"])
def test_the_trees_host_levels_are_the_device_levels_bit_for_bit(name, kernel, normalize, dtype):
    # recursive: depth 4 with steps of 8, levels 0-3 a block, level 4 gathered; recursive_pair:
    # a short last batch of 4, appended unbalanced
    n, b, d = 36, 8, 11
    zs = random_grads(n, d, epochs=3, seed=7)
    options = {"kernel": kernel, "c": 2.0, "normalize": normalize, "dtype": dtype, "depth": 4}
    host, device = (make(name, n, d, batch_size=b, **options) for _ in range(2))
    got = _tree_epochs(host, zs, b, device_path=False)
    want = _tree_epochs(device, zs, b, device_path=True)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    assert got[0].abs().sum() > 0 and not torch.equal(got[1], got[3])  # it balanced
