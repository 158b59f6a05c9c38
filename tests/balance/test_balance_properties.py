"""Properties every ordering must have: permutations, partial epochs, gradient-free semantics,
herding quality, gradient dicts, set_epoch no-op, state size."""

from __future__ import annotations

import warnings

import pytest
import torch
from support.helpers import (
    ALL_ORDERINGS,
    BALANCES,
    KERNELS,
    current_order,
    is_permutation,
    make,
    random_grads,
    run_epochs,
    step_epoch,
)

B = 4


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("n", [1, 2, 7, 38])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_ORDERINGS)
def test_every_epoch_is_a_permutation(name, kernel, n, normalize):
    """Full epochs, an early-stopped one, one with no steps at all; b = 4 does not divide 7, 38."""
    bal = make(name, n, 3, batch_size=B, depth=3, kernel=kernel, normalize=normalize, seed=n)
    zs = random_grads(n, 3, 4, seed=n)
    assert is_permutation(current_order(bal), n)
    for epoch, steps in enumerate([None, (n // 2) // B * B, 0, None]):
        step_epoch(bal, zs[epoch], B, steps)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            bal.set_epoch(epoch + 1)
        assert bal.epoch == epoch + 1
        assert is_permutation(current_order(bal), n), f"epoch {epoch + 1}"


@pytest.mark.parametrize("steps", [0, 8, 12, 28])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", BALANCES)
def test_partial_epoch_appends_the_rest_in_previous_order(name, kernel, steps):
    n = 29
    bal = make(name, n, 3, batch_size=B, depth=2, kernel=kernel)
    zs = random_grads(n, 3, 2, seed=1)
    run_epochs(bal, zs[:1], B)  # a full epoch first, so the order is not the first one
    before = current_order(bal)
    step_epoch(bal, zs[1], B, steps)
    with pytest.warns(UserWarning, match=rf"\b{n - steps}\b"):
        bal.set_epoch(2)
    after = current_order(bal)
    assert after[steps:] == before[steps:]
    assert sorted(after[:steps]) == sorted(before[:steps])


def test_gradient_free_orderings():
    n, zs = 50, random_grads(50, 3, 3)
    rr = run_epochs(make("rr", n, 3, seed=1), zs, B)
    assert all(is_permutation(o, n) for o in rr)
    assert len({tuple(o) for o in rr}) == len(rr)  # a fresh permutation each epoch
    assert run_epochs(make("rr", n, 3, seed=1), zs, B) == rr  # seeded
    assert run_epochs(make("rr", n, 3, seed=2), zs, B) != rr
    so = run_epochs(make("so", n, 3, seed=1), zs, B)
    assert so[0] != list(range(n)) and all(o == so[0] for o in so)
    assert make("so", n, 3, seed=2).order.tolist() != so[0]
    fixed = run_epochs(make("fixed", n, 3, seed=1), zs, B)
    assert all(o == list(range(n)) for o in fixed)
    bal = make("rr", n, 3)  # gradient-free orderings also accept step() without gradients
    bal.step(None, indices=bal.order[:B].clone())
    bal.step(indices=bal.order[B : 2 * B].clone())


def test_deterministic_kernel_ignores_the_seed_with_identity_first_epoch():
    zs = random_grads(30, 3, 3, seed=2)
    for name in BALANCES:
        runs = [
            run_epochs(make(name, 30, 3, seed=s, first_epoch="identity"), zs, B) for s in (0, 1)
        ]
        assert runs[0] == runs[1], name


def discrepancy(z: torch.Tensor, order) -> float:
    centered = z[torch.as_tensor(order)] - z.mean(0)
    return centered.cumsum(0).abs().max().item()


@pytest.mark.parametrize("name", BALANCES)
def test_herding_quality_after_five_epochs(name):
    n, d, b = 512, 16, 16
    g = torch.Generator().manual_seed(1234)
    z = torch.randn(n, d, generator=g)
    random_orders = [torch.randperm(n, generator=g) for _ in range(200)]
    median = torch.tensor([discrepancy(z, o) for o in random_orders]).median().item()
    bal = make(name, n, d, batch_size=b, seed=0)
    order = run_epochs(bal, [z] * 5, b)[-1]
    bound = median / 3 if name == "mean" else median / 2
    assert discrepancy(z, order) < bound
    assert discrepancy(z, run_epochs(make(name, n, d, batch_size=b), [z], b)[0]) > bound


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", BALANCES)
def test_gradient_dict_equals_flat_tensor(name, kernel):
    """step() takes the dict torch.func.vmap(grad) returns; the flattening order is irrelevant
    to the balancing (only dot products), so it must match the concatenated tensor."""
    n, b = 24, 4
    zs = random_grads(n, 2 * 3 + 4, 3, seed=7)
    flat = run_epochs(make(name, n, 10, kernel=kernel, dtype=torch.float64), zs, b)
    bal = make(name, n, 10, kernel=kernel, dtype=torch.float64)
    for z in zs:
        order = bal.order.clone()
        for start in range(0, n, b):
            rows = z[order[start : start + b]]
            bal.step({"w": rows[:, :6].reshape(-1, 2, 3), "b": rows[:, 6:]})
        bal.set_epoch(bal.epoch + 1)
    assert current_order(bal) == flat[-1]


@pytest.mark.parametrize("name", ALL_ORDERINGS)
def test_set_epoch_to_the_current_epoch_is_a_no_op(name):
    n, b, zs = 20, 4, random_grads(20, 3, 2, seed=3)
    plain = run_epochs(make(name, n, 3, kernel="probabilistic"), zs, b)
    bal = make(name, n, 3, kernel="probabilistic")
    for z in zs:
        order = bal.order.clone()
        with warnings.catch_warnings():
            warnings.simplefilter("error", UserWarning)
            for start in range(0, n, b):
                bal.set_epoch(bal.epoch)
                bal.step(z[order[start : start + b]])
            bal.set_epoch(bal.epoch)
            assert current_order(bal) == order.tolist()
            bal.set_epoch(bal.epoch + 1)
    assert current_order(bal) == plain[-1]


def test_normalize_scale_invariance_in_the_first_epoch():
    """With normalize, rescaling each gradient by a positive factor cannot change the first
    epoch's signs (the stale mean is 0 then); without it, it does (on this data)."""
    n, d = 40, 4
    z = random_grads(n, d, 1, seed=8)[0]
    scale = torch.rand(n, 1, generator=torch.Generator().manual_seed(8), dtype=z.dtype) * 50
    for normalize, same in [(True, True), (False, False)]:
        orders = [
            run_epochs(make("mean", n, d, normalize=normalize, dtype=z.dtype), [M], B)[-1]
            for M in (z, z * scale)
        ]
        assert (orders[0] == orders[1]) is same, normalize


def test_state_bytes():
    d, f64 = 10, torch.float64
    sizes = [make("recursive", 64, d, depth=k, dtype=f64).state_bytes() for k in range(4)]
    assert all(isinstance(s, int) for s in sizes)
    for k in range(4):  # at least the 2^(D+1) - 1 accumulators
        assert sizes[k] >= (2 ** (k + 1) - 1) * d * 8
    assert sizes == sorted(sizes) and len(set(sizes)) == 4
    assert make("mean", 64, d, dtype=f64).state_bytes() >= d * 8
