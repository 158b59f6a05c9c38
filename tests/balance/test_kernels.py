"""The probabilistic sign kernel: seeded, and provably following
P(+) = clamp(1/2 - <v, acc>/(2c), 0, 1)."""

from __future__ import annotations

import math

import pytest
import torch
from support.helpers import BALANCES, current_order, make, random_grads, run_epochs
from support.reference_orderings import reference_next

DELTA = 1e-10  # failure probability allowed to each statistical bound


@pytest.mark.parametrize("name", BALANCES)
def test_probabilistic_is_seeded(name):
    zs = random_grads(32, 4, 3, seed=1)
    kw = {"kernel": "probabilistic", "first_epoch": "identity", "batch_size": 4, "depth": 2}
    runs = [run_epochs(make(name, 32, 4, seed=s, **kw), zs, 4) for s in (3, 3, 4)]
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]  # the seed changes the signs, not just the first order


class NeedTieBitError(Exception):
    pass


def tie_resolving_sign(bits):
    """Deterministic sign where <v, acc> != 0; ties take the next of ``bits``."""
    queue = list(bits)

    def sign(v, acc):
        dot = float(torch.dot(v, acc))
        if dot != 0:
            return 1 if dot < 0 else -1
        if not queue:
            raise NeedTieBitError
        return queue.pop(0)

    return sign


def all_tie_outcomes(name, order, z, state, b, depth):
    """Next orders of the reference for every way of breaking the ties <v, acc> = 0."""
    outcomes, pending = set(), [()]
    while pending:
        bits = pending.pop()
        try:
            nxt, _ = reference_next(
                name, order, z, state, batch_size=b, depth=depth, sign=tie_resolving_sign(bits)
            )
            outcomes.add(tuple(nxt))
        except NeedTieBitError:
            pending += [(*bits, 1), (*bits, -1)]
    return outcomes


def test_tiny_c_agrees_with_deterministic_where_the_dot_is_nonzero():
    """c = 1e-12: P(+) is 0 or 1 unless <v, acc> = 0 (acc = 0 at the start of an epoch or
    node, where it is 1/2). So every next order is the reference's for some tie-breaking."""
    n, d, b, depth = 24, 4, 4, 2
    zs = random_grads(n, d, 3, seed=2)
    differs_from_deterministic = 0
    for name in BALANCES:
        bal = make(name, n, d, kernel="probabilistic", c=1e-12, dtype=torch.float64,
                   batch_size=b, depth=depth, seed=5)  # fmt: skip
        state = torch.zeros(d, dtype=torch.float64)
        for epoch, z in enumerate(zs):
            order = current_order(bal)
            got = run_epochs(bal, [z], b)[-1]
            outcomes = all_tie_outcomes(name, order, z, state, b, depth)
            assert tuple(got) in outcomes, f"{name} epoch {epoch}"
            det, state = reference_next(name, order, z, state, batch_size=b, depth=depth)
            differs_from_deterministic += got != det
    assert differs_from_deterministic > 0  # the ties really are coin flips


def pair_signs(n, d, c, epochs, seed):
    """Run pair balance (n even) with the probabilistic kernel and read back every pair's sign
    from the orders (pair k's positive member lands at position k of the next order), with
    the dot <v_k, acc> it was drawn against (acc rebuilt from the observed signs)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n, d, generator=g, dtype=torch.float64)
    bal = make("pair", n, d, kernel="probabilistic", c=c, seed=seed, dtype=torch.float64)
    signs, dots = [], []
    for _ in range(epochs):
        order = bal.order.clone()
        nxt = torch.tensor(run_epochs(bal, [z], 16)[-1])
        first, second = order[0::2], order[1::2]
        s = torch.where(nxt[: n // 2] == first, 1.0, -1.0).to(torch.float64)
        assert torch.all((nxt[: n // 2] == first) | (nxt[: n // 2] == second))
        v = z[first] - z[second]
        acc_before = torch.cumsum(s[:, None] * v, 0) - s[:, None] * v
        signs.append(s)
        dots.append((v * acc_before).sum(1))
    return torch.cat(signs), torch.cat(dots)


def hoeffding(count: int, delta: float = DELTA) -> float:
    """t with P(|martingale of `count` steps of range 1| >= t) <= delta (Azuma-Hoeffding)."""
    return math.sqrt(count * math.log(2 / delta) / 2)


def test_huge_c_gives_fair_coins():
    c = 1e12
    signs, dots = pair_signs(n=2000, d=4, c=c, epochs=5, seed=0)
    count = len(signs)
    bias = count * dots.abs().max().item() / (2 * c)  # |P(+) - 1/2| summed, ~1e-8
    plus = (signs > 0).sum().item()
    agree = (signs == torch.where(dots < 0, 1.0, -1.0)).sum().item()
    assert abs(plus - count / 2) <= hoeffding(count) + bias
    # the deterministic kernel would agree with itself on every sign
    assert abs(agree - count / 2) <= hoeffding(count) + bias


def test_signs_follow_their_probability():
    """c of the order of |<v, acc>|: in every band of P(+), the number of + is within a
    deviation bound of the sum of the probabilities. Band membership is known before the coin
    is drawn, so the band's own partial sums form a martingale (optional skipping); Azuma-
    Hoeffding at each possible band size plus a union bound over sizes gives the margin.
    Getting the 2c in the formula wrong by a factor of 2 exceeds it several times over."""
    c = 8.0
    signs, dots = pair_signs(n=10000, d=4, c=c, epochs=5, seed=1)
    p = (0.5 - dots / (2 * c)).clamp(0, 1)
    count = len(signs)
    bands = [(0.0, 0.2), (0.2, 0.45), (0.45, 0.55), (0.55, 0.8), (0.8, 1.0 + 1e-9)]
    for lo, hi in bands:
        band = (p >= lo) & (p < hi)
        size = int(band.sum())
        assert size > count // 20, "the test data do not exercise this band"
        excess = ((signs[band] > 0).double() - p[band]).sum().item()
        margin = math.sqrt(size * math.log(2 * count * len(bands) / DELTA) / 2)
        assert abs(excess) <= margin, (lo, hi, excess, margin)
