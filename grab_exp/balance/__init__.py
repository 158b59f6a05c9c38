"""GraB orderings: one module per variant, all built on :class:`Balance`."""

from __future__ import annotations

from grab_exp.balance.base import Balance
from grab_exp.balance.batch import BatchBalance
from grab_exp.balance.centered import CenteredBalance
from grab_exp.balance.fixed import FixedOrder
from grab_exp.balance.kernels import DeterministicKernel, ProbabilisticKernel, SignKernel
from grab_exp.balance.mean import MeanBalance
from grab_exp.balance.pair import PairBalance
from grab_exp.balance.recursive import RecursiveBalance
from grab_exp.balance.recursive_pair import RecursivePairBalance
from grab_exp.balance.rr import RandomReshuffle
from grab_exp.balance.so import ShuffleOnce
from grab_exp.validation import check_choice


def make_balance(name: str, n: int, d: int, **kwargs) -> Balance:
    """Build an ordering by its name (``Balance.registry``: rr, so, fixed, mean, ...)."""
    check_choice("balance", name, Balance.registry)
    return Balance.registry[name](n, d, **kwargs)


__all__ = [
    "Balance",
    "BatchBalance",
    "CenteredBalance",
    "DeterministicKernel",
    "FixedOrder",
    "MeanBalance",
    "PairBalance",
    "ProbabilisticKernel",
    "RandomReshuffle",
    "RecursiveBalance",
    "RecursivePairBalance",
    "ShuffleOnce",
    "SignKernel",
    "make_balance",
]
