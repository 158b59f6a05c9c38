"""Orders must not depend on how an epoch is cut into step() calls, where the spec allows it."""

from __future__ import annotations

import pytest
from support.helpers import KERNELS, make, random_grads, run_epochs

from grab_exp.sampler import GraBSampler

# batch balance is defined per mini-batch, recursive_pair needs whole mini-batches of b
SPLIT_FREE = ["mean", "pair", "recursive"]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", SPLIT_FREE)
def test_orders_do_not_depend_on_the_step_size(name, kernel):
    zs = random_grads(40, 5, 3, seed=1)
    orders = [
        run_epochs(make(name, 40, 5, kernel=kernel, c=3.0, depth=2, dtype="float64"), zs, b)
        for b in (1, 3, 4, 8)
    ]
    assert all(o == orders[0] for o in orders[1:])


def test_sampler_without_d_is_rejected_for_gradient_orderings():
    with pytest.raises(ValueError, match=r"^d: required by balance 'mean'"):
        GraBSampler(10, balance="mean")
    assert len(GraBSampler(10, balance="rr")) == 10
