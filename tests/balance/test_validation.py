"""Bad settings and bad step() calls raise one-line ValueErrors that name the setting."""

from __future__ import annotations

import pytest
import torch
from support.grab_run import compose_config
from support.helpers import (
    ALL_ORDERINGS,
    BALANCES,
    GRADIENT_FREE,
    current_order,
    make,
    random_grads,
    run_epochs,
)

from grab_exp.balance import Ordering, make_ordering
from grab_exp.runner.config.check import ConfigError, validate_config
from grab_exp.sampler import GraBSampler


def raises_one_line(match, fn, *args, **kwargs) -> str:
    with pytest.raises(ValueError, match=match) as info:
        fn(*args, **kwargs)
    message = str(info.value)
    assert "\n" not in message.strip(), message
    return message


def test_unknown_variant_lists_the_allowed_ones():
    from grab_exp.balance import make_ordering

    message = raises_one_line("balance", make_ordering, "meen", 10, 3)
    assert "meen" in message
    for name in ALL_ORDERINGS:
        assert name in message


@pytest.mark.parametrize("name", BALANCES)
def test_bad_balance_settings(name):
    message = raises_one_line("kernel", make, name, 10, 3, kernel="gaussian")
    assert "deterministic" in message and "probabilistic" in message
    for c in (0.0, -1.0):
        raises_one_line(r"\bc\b", make, name, 10, 3, kernel="probabilistic", c=c)
    for d in (0, -3):
        raises_one_line(r"\bd\b", make, name, 10, d)
    for n in (0, -1):
        raises_one_line(r"\bn\b", make, name, n, 3)
    message = raises_one_line("first_epoch", make, name, 10, 3, first_epoch="sorted")
    assert "identity" in message


@pytest.mark.parametrize("name", ALL_ORDERINGS)
def test_bad_n_for_every_ordering(name):
    raises_one_line(r"\bn\b", make, name, 0, 3)


@pytest.mark.parametrize("batch_size", [0, 3, 6, 12, -4])
def test_recursive_pair_batch_size_must_be_a_power_of_two(batch_size):
    raises_one_line("batch_size", make, "recursive_pair", 32, 3, batch_size=batch_size)


def test_negative_depth():
    raises_one_line("depth", make, "recursive", 32, 3, depth=-1)
    make("recursive", 32, 3, depth=0)  # D = 0 is allowed


def test_class_constructors_validate_too():
    from grab_exp.balance import MeanBalance, RecursiveBalance, RecursivePairBalance

    raises_one_line("kernel", MeanBalance, 10, 3, kernel="nope")
    raises_one_line("depth", RecursiveBalance, 10, 3, depth=-2)
    raises_one_line("batch_size", RecursivePairBalance, 10, 3, batch_size=5)


@pytest.mark.parametrize("name", BALANCES)
def test_bad_step_calls_raise_and_change_nothing(name):
    n, d, b = 20, 3, 4
    zs = random_grads(n, d, 2, seed=6)
    clean = run_epochs(make(name, n, d), zs, b)
    bal = make(name, n, d)
    order = bal.order.clone()
    z = zs[0]
    nxt = order[:b]
    raises_one_line(None, bal.step, z[nxt], indices=order[1 : b + 1])  # not the next ones
    raises_one_line(None, bal.step, z[nxt], indices=nxt.flip(0))  # next ones, wrong order
    raises_one_line(None, bal.step, z[nxt], indices=order[: b - 1])  # rows != indices
    raises_one_line(None, bal.step, z[nxt][:, :2])  # wrong d
    bad_dict = {"w": z[nxt][:, :2], "b": z[nxt][:3, 2:]}  # leading dims disagree
    with pytest.raises(ValueError):
        bal.step(bad_dict)
    for s in range(0, n - b, b):
        bal.step(z[order[s : s + b]], indices=order[s : s + b])
    raises_one_line(None, bal.step, z[order[: 2 * b]])  # more rows than the epoch has left
    bal.step(z[order[n - b :]], indices=order[n - b :])
    raises_one_line(None, bal.step, z[order[:1]])  # the epoch is over
    bal.set_epoch(1)
    assert run_epochs(bal, zs[1:], b) == clean[1:]
    assert current_order(bal) == clean[-1]


def test_set_epoch_cannot_go_back():
    bal = make("mean", 10, 3)
    bal.step(torch.zeros(10, 3))
    bal.set_epoch(1)
    with pytest.raises(ValueError, match="epoch"):
        bal.set_epoch(0)


GRADIENT_OPTIONS = {
    "kernel": "probabilistic",
    "c": 5.0,
    "normalize": True,
    "dtype": "float64",
    "projection_dim": 8,
    "projection_kind": "gaussian",
    "projection_block_rows": 16,
}


@pytest.mark.parametrize("option", sorted(GRADIENT_OPTIONS))
@pytest.mark.parametrize("name", GRADIENT_FREE)
def test_gradient_free_orderings_take_no_gradient_option(name, option):
    """``rr``, ``so`` and ``fixed`` read no gradients: a kernel, a projection or a dtype given
    to one is refused in one line naming the option and what the ordering takes, not ignored."""
    value = GRADIENT_OPTIONS[option]
    with pytest.raises(
        ValueError,
        match=rf"^balance\.{option}: {name} takes no {option} "
        r"\(it reads no gradients\); allowed: device, first_epoch, lanes, seed$",
    ):
        make_ordering(name, 10, 100, **{option: value})
    with pytest.raises(ValueError, match=rf"^balance\.{option}: {name} takes no {option}"):
        GraBSampler(10, 100, balance=name, **{option: value})


@pytest.mark.parametrize("name", GRADIENT_FREE)
def test_a_config_giving_a_gradient_free_ordering_a_kernel_is_refused(name):
    """The same refusal through the runner's validation (``+balance.kernel``: the ordering's
    YAML has no such key, so Hydra's own override would already refuse ``balance.kernel``)."""
    cfg = compose_config(["experiment=smoke", f"balance={name}", "+balance.kernel=probabilistic"])
    with pytest.raises(ConfigError, match=rf"^balance\.kernel: {name} takes no kernel"):
        validate_config(cfg)


@pytest.mark.parametrize("option", sorted(GRADIENT_OPTIONS))
def test_gradient_orderings_take_every_gradient_option(option):
    value = GRADIENT_OPTIONS[option]
    for name in BALANCES:
        assert option in Ordering.choices()[name].options()
    make("mean", 10, 100, **{option: value})  # built, not refused
