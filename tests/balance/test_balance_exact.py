"""The fast orderings against the plain per-example references (deterministic kernel, float64)."""

from __future__ import annotations

import pytest
import torch
from support.helpers import current_order, is_permutation, make, random_grads, run_epochs
from support.reference_orderings import (
    batch_balance,
    mean_balance,
    recursive_balance,
    reference_next,
    reference_orders,
)

EPOCHS = 4
D = 5
F64 = {"dtype": torch.float64, "kernel": "deterministic"}


def assert_matches_reference(name, n, b, *, depth=5, seed=0, first_epoch="random", **kwargs):
    zs = random_grads(n, D, EPOCHS, seed=seed)
    bal = make(name, n, D, batch_size=b, depth=depth, seed=seed, first_epoch=first_epoch, **F64)
    got = run_epochs(bal, zs, b)
    want = reference_orders(name, got[0], zs, batch_size=b, depth=depth)
    for epoch, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g == w, f"{name} n={n} b={b} depth={depth}: epoch {epoch} differs"


# (n, b): n even and odd, b dividing n and not, b = 1, b > n, b = n.
SIZES = [(40, 4), (37, 4), (41, 6), (64, 16), (50, 7), (13, 1), (9, 16), (24, 24)]


@pytest.mark.parametrize(("n", "b"), SIZES)
@pytest.mark.parametrize("name", ["mean", "batch"])
def test_centered_variants_match_reference(name, n, b):
    assert_matches_reference(name, n, b)


@pytest.mark.parametrize(("n", "b"), [*SIZES, (38, 3), (39, 5), (20, 3)])
def test_pair_matches_reference(n, b):
    # odd mini-batch sizes: pairs straddle two step() calls
    assert_matches_reference("pair", n, b)


@pytest.mark.parametrize("depth", [0, 1, 2, 3, 5])
@pytest.mark.parametrize(("n", "b"), [(40, 4), (37, 5), (64, 16)])
def test_recursive_matches_reference(depth, n, b):
    assert_matches_reference("recursive", n, b, depth=depth)


@pytest.mark.parametrize("b", [1, 2, 4, 8, 16])
@pytest.mark.parametrize("n", [64, 37, 42])
def test_recursive_pair_matches_reference(n, b):
    # b not dividing n: the final partial mini-batch is appended in visit order
    assert_matches_reference("recursive_pair", n, b)


@pytest.mark.parametrize("name", ["mean", "pair", "batch", "recursive", "recursive_pair"])
def test_identity_first_epoch_and_other_seed(name):
    assert_matches_reference(name, 33, 4, depth=2, seed=5, first_epoch="identity")
    bal = make(name, 33, D, first_epoch="identity", **F64)
    assert current_order(bal) == list(range(33))


@pytest.mark.parametrize("kernel", ["deterministic", "probabilistic"])
@pytest.mark.parametrize(("n", "b"), [(40, 4), (37, 5)])
def test_recursive_depth_zero_equals_mean(kernel, n, b):
    zs = random_grads(n, D, EPOCHS, seed=3)
    kw = {"dtype": torch.float64, "kernel": kernel, "c": 2.0, "seed": 11}
    rec = run_epochs(make("recursive", n, D, depth=0, **kw), zs, b)
    mean = run_epochs(make("mean", n, D, **kw), zs, b)
    assert rec == mean


def test_batch_size_one_batch_balance_equals_mean():
    zs = random_grads(31, D, EPOCHS, seed=4)
    batch = run_epochs(make("batch", 31, D, **F64), zs, 1)
    mean = run_epochs(make("mean", 31, D, **F64), zs, 1)
    assert batch == mean


@pytest.mark.parametrize(
    ("name", "n", "b", "steps"),
    [
        ("mean", 37, 4, 22),
        ("batch", 37, 4, 23),
        ("recursive", 37, 4, 21),
        ("pair", 37, 3, 20),
        ("recursive_pair", 37, 4, 24),
        ("recursive_pair", 37, 8, 16),
    ],
)
def test_partial_epochs_match_reference(name, n, b, steps):
    """Early stop each epoch: the stepped examples are balanced (the stale mean is the mean of
    those), the rest keeps its relative order at the end, and the warning gives the count."""
    zs = random_grads(n, D, 3, seed=9)
    bal = make(name, n, D, batch_size=b, depth=2, **F64)
    order, state = current_order(bal), torch.zeros(D, dtype=torch.float64)
    for z in zs:
        for start in range(0, steps, b):
            idx = torch.tensor(order[start : min(start + b, steps)])
            bal.step(z[idx], indices=idx)
        with pytest.warns(UserWarning, match=rf"\b{n - steps}\b"):
            bal.set_epoch(bal.epoch + 1)
        order, state = reference_next(name, order, z, state, batch_size=b, depth=2, steps=steps)
        assert current_order(bal) == order


# --- the reference itself: cheap consistency checks, so a broken reference fails loudly ---


@pytest.mark.parametrize("n", [1, 2, 7, 16, 37])
@pytest.mark.parametrize("name", ["mean", "pair", "batch", "recursive", "recursive_pair"])
def test_reference_returns_permutations(name, n):
    zs = random_grads(n, 3, 3, seed=n)
    first = torch.randperm(n, generator=torch.Generator().manual_seed(n)).tolist()
    for order in reference_orders(name, first, zs, batch_size=4, depth=3):
        assert is_permutation(order, n)
    for steps in range(n + 1):
        nxt, _ = reference_next(name, first, zs[0], zs[1][0], batch_size=4, depth=2, steps=steps)
        assert is_permutation(nxt, n)
        assert nxt[steps:] == first[steps:]


def test_reference_special_cases_agree():
    z = random_grads(23, 4, 1, seed=1)[0]
    m = z.mean(0)
    order = list(range(23))
    want = mean_balance(order, z, m)[0]
    assert recursive_balance(order, z, m, 0)[0] == want
    assert batch_balance(order, z, m, 1)[0] == want
    assert batch_balance(order, z, m, 4)[0] != want  # batch signing does change something
    # first vector of an epoch gets "-" and so ends up last
    assert want[-1] == order[0]


@pytest.mark.parametrize("name", ["mean", "pair", "recursive"])
def test_irregular_step_sizes(name):
    """Only batch and recursive_pair depend on the mini-batches; the others must give the
    reference's orders whatever the step sizes (here 1, 2, 3, ... rows per step)."""
    n = 41
    zs = random_grads(n, D, 3, seed=12)
    bal = make(name, n, D, depth=2, **F64)
    got = [current_order(bal)]
    for z in zs:
        order, start, size = bal.order.clone(), 0, 1
        while start < n:
            bal.step(z[order[start : start + size]])
            start, size = start + size, size + 1
        bal.set_epoch(bal.epoch + 1)
        got.append(current_order(bal))
    assert got == reference_orders(name, got[0], zs, batch_size=1, depth=2)
