"""The fuzzer's one source of choices: :class:`Draw`, a ``random.Random(seed)`` that names every
feature it turns on, so a case's features are known and any of them can be turned off again.

Every choice consumes the same random numbers whether a feature is on or off, so turning one
feature off (``off``) leaves every other choice of the seed as it was: that is how a failing case
is shrunk (:func:`fuzz.oracle.shrink`).
"""

from __future__ import annotations

import random
from collections.abc import Sequence

import torch


class Draw:
    """Seeded choices that record the features they turn on.

    Args:
        seed: the case's seed.
        off: features forced off (a choice among options falls back to the first option).
        only: if given, the features on: every other is off (a regression's minimal model).

    Attributes:
        features: the features turned on so far, in the order drawn.
    """

    def __init__(
        self, seed: int, off: frozenset[str] = frozenset(), only: frozenset[str] | None = None
    ) -> None:
        self.rng = random.Random(seed)
        self.off, self.only = off, only
        self.features: list[str] = []

    def allowed(self, feature: str, drawn: bool) -> bool:
        """Whether ``feature`` is on, given that the draw turned it on or not."""
        if self.only is not None:
            return feature in self.only
        return drawn and feature not in self.off

    def chance(self, feature: str, p: float) -> bool:
        """Whether ``feature`` is on (probability ``p``, never when it is in ``off``)."""
        on = self.allowed(feature, self.rng.random() < p)
        if on:
            self.features.append(feature)
        return on

    def pick(self, kind: str, options: Sequence[str], weights: Sequence[float] | None = None):
        """One of ``options``; records ``kind:option`` unless it is the first (the plain one).
        An option in ``off`` (as ``kind:option``) falls back to the first."""
        drawn = self.rng.choices(list(options), weights=weights)[0]
        on = [o for o in options if self.allowed(f"{kind}:{o}", o == drawn)]
        choice = on[0] if on else options[0]
        if choice != options[0]:
            self.features.append(f"{kind}:{choice}")
        return choice

    def int(self, low: int, high: int) -> int:
        """A size in ``[low, high]`` (not a feature)."""
        return self.rng.randint(low, high)

    def generator(self) -> torch.Generator:
        """A torch generator seeded from this draw (for tensors: weights, inputs)."""
        return torch.Generator().manual_seed(self.rng.getrandbits(62))
