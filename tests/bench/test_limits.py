"""Stage limits of ``bench epoch``: the work each stage must do, from the shapes, and its
roofline time at a machine's rates."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grab_exp.balance import make_ordering
from grab_exp.balance.base import NO_WORK, Work
from grab_exp.bench.limits import (
    gsnr_work,
    limit_seconds,
    machine_rates,
    model_flops,
    multiples,
    optimizer_work,
)

N, D, B = 64, 40, 8


def test_a_one_node_tree_does_mean_balances_work():
    """recursive at depth 0 is mean balance (one node, the accumulator): the same work."""
    mean = make_ordering("mean", N, D).work(B)
    assert make_ordering("recursive", N, D, depth=0).work(B) == mean
    deeper = make_ordering("recursive", N, D, depth=3).work(B)
    # levels 0-3 visit 1 + 2 + 4 + 8 = 15 nodes (at most B a level), each read and written
    assert deeper.bytes - mean.bytes == 2 * (1 + 2 + 4 + 8 - 1) * D * 4
    assert deeper.flops - mean.flops == 3 * 4 * B * D  # three more levels of a dot and an update


def test_mean_reads_its_rows_once_and_its_state_once():
    work = make_ordering("mean", N, D).work(B)
    # rows, then acc read and written, the stale mean read, the raw sum read and written
    assert work.bytes == B * D * 4 + (2 + 1 + 2) * D * 4
    assert work.flops == (1 + 2 + 2 + 1) * B * D  # center, dot, update, raw sum a value


def test_gradient_free_orderings_have_no_work_and_float64_state_doubles_the_bytes():
    assert make_ordering("rr", N, D).work(B) == NO_WORK
    single = make_ordering("pair", N, D).work(B)
    double = make_ordering("pair", N, D, dtype=torch.float64).work(B)
    assert double == Work(2 * single.bytes, single.flops)


def test_a_sketch_adds_its_product_and_balances_at_its_length():
    k = 8
    sketched = make_ordering("mean", N, D, projection_dim=k).work(B)
    assert sketched.flops == 2 * B * D * k + 6 * B * k
    assert sketched.bytes == B * D * 4 + 5 * k * 4


def test_recursive_pair_signs_half_the_rows_at_each_level():
    work = make_ordering("recursive_pair", N, D, batch_size=B).work(B)
    levels, nodes = 3, B - 1
    assert work == Work(B * D * 4 + 2 * nodes * D * 4, levels * 5 * B * D // 2)


def test_model_flops_count_the_products_autograd_runs_and_touch_nothing():
    model = nn.Linear(10, 5)
    x, y = torch.randn(4, 10), torch.randint(0, 5, (4,))
    flops = model_flops(model, nn.functional.cross_entropy, x, y)
    assert flops == 2 * 2 * 4 * 10 * 5  # x W^T, then the gradient at W (x needs none)
    x.requires_grad_()
    assert model_flops(model, nn.functional.cross_entropy, x, y) == 3 * 2 * 4 * 10 * 5
    assert model.weight.grad is None


def test_optimizer_work_counts_the_state_it_keeps():
    p = nn.Parameter(torch.randn(6, 5))
    plain = torch.optim.SGD([p], lr=0.1)
    assert optimizer_work(plain) == Work(30 * 4 * 3, 30 * 2)  # p read and written, grad read
    momentum = torch.optim.SGD([p], lr=0.1, momentum=0.9)
    p.grad = torch.ones_like(p)
    momentum.step()  # makes the momentum buffer
    assert optimizer_work(momentum) == Work(30 * 4 * 5, 30 * 4)


def test_the_limit_is_the_slower_of_moving_and_computing():
    rates = {"stream_gb_s": 10.0, "matmul_gflop_s": 100.0}
    assert limit_seconds(Work(10**9, 10**9), rates) == pytest.approx(0.1)  # bytes bound
    assert limit_seconds(Work(10**6, 10**11), rates) == pytest.approx(1.0)  # flops bound
    assert gsnr_work(B, D, 4) == Work(B * D * 4, 3 * B * D)


def test_multiples_are_time_over_limit_and_none_without_a_limit_or_a_time():
    limits = {"grads": {"limit_ms": 0.5}, "ordering": {"limit_ms": 0.0}, "gsnr": {"limit_ms": 1}}
    got = multiples({"grads": 2.0, "ordering": 0.1, "gsnr": None}, limits)
    assert got == {"grads": 4.0, "ordering": None, "gsnr": None}


def test_machine_rates_are_positive():
    rates = machine_rates(torch.device("cpu"), repeats=3)
    assert rates["stream_gb_s"] > 0 and rates["matmul_gflop_s"] > 0
