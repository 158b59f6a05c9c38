"""How many operators a training step dispatches: on a GPU each one is a kernel launch.

:class:`OperatorCount` is a ``TorchDispatchMode``: it sees every aten operator below autograd
(the backward and ``torch.func`` transforms included) and counts those that are not views
(``view``, ``slice``, ``permute``, ``detach``, ... only make new metadata). Work done outside
torch, such as the CPU's numpy sign loop, is not an operator and is not counted.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode


class OperatorCount(TorchDispatchMode):
    """Counts the non-view aten operators run inside it, by name (``counts``)."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None) -> Any:
        if func.namespace == "aten" and not func.is_view:
            self.counts[str(func.overloadpacket.__name__)] += 1
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        """Operators counted so far."""
        return sum(self.counts.values())
