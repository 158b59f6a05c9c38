"""GraB orderings: one module per ordering, all built on :class:`Ordering` (those that read
gradients on :class:`GradientOrdering`)."""

from __future__ import annotations

from grab_exp.balance.base import Ordering
from grab_exp.balance.batch import BatchBalance
from grab_exp.balance.centered import CenteredBalance
from grab_exp.balance.fixed import FixedOrder
from grab_exp.balance.gradient import GradientOrdering
from grab_exp.balance.kernels import DeterministicKernel, ProbabilisticKernel, SignKernel
from grab_exp.balance.mean import MeanBalance
from grab_exp.balance.pair import PairBalance
from grab_exp.balance.recursive import RecursiveBalance
from grab_exp.balance.recursive_pair import RecursivePairBalance
from grab_exp.balance.rr import RandomReshuffle
from grab_exp.balance.so import ShuffleOnce
from grab_exp.validation import check_choice


def make_ordering(name: str, n: int, d: int, **kwargs) -> Ordering:
    """Build a single-process ordering by its name (rr, so, fixed, mean, pair, ...)."""
    choices = Ordering.choices()
    check_choice("balance", name, choices)
    choices[name].check_options(kwargs)
    return choices[name](n, d, **kwargs)


__all__ = [
    "BatchBalance",
    "CenteredBalance",
    "DeterministicKernel",
    "FixedOrder",
    "GradientOrdering",
    "MeanBalance",
    "Ordering",
    "PairBalance",
    "ProbabilisticKernel",
    "RandomReshuffle",
    "RecursiveBalance",
    "RecursivePairBalance",
    "ShuffleOnce",
    "SignKernel",
    "make_ordering",
]
