"""What ``Ordering.step`` checks beside the gradients (:mod:`grab_exp.grads`): dtypes, indices."""

from __future__ import annotations

import functools

import torch

from grab_exp.devices import host_reads_allowed
from grab_exp.validation import check_choice

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` / ``torch.float64`` from a dtype or its name."""
    name = str(dtype).removeprefix("torch.") if isinstance(dtype, torch.dtype) else dtype
    check_choice("balance.dtype", name, DTYPES)
    return DTYPES[name]


@functools.cache
def counting(count: int, device: torch.device) -> torch.Tensor:
    """``arange(count)`` on ``device``, made once per count (never written to)."""
    return torch.arange(count, device=device)


class IndexCheck:
    """Counts refused steps: indices that differ from the order's next ones, a step past the
    epoch's end, an ordering's own refusals (:meth:`refuse`).

    Where the host may read the device for free (the CPU, outside a captured step) a step's
    refusals raise before it changes anything (:meth:`raise_if_free`); elsewhere the counts stay
    on the device (no synchronization inside ``step``) until ``raise_if_bad`` (state_dict, next
    epoch).
    """

    MISMATCH = (
        "step: indices are not the next ones of the current order; iterate the sampler (or "
        "index_batches) and step each batch once, in order"
    )
    OVERRUN = (
        "step: got more rows than the epoch had left; call set_epoch(epoch + 1) after the "
        "epoch's last example"
    )
    SLOTS = 4  # messages an ordering may count (the two above among them): each a constant

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.counts = torch.zeros(self.SLOTS, dtype=torch.long, device=device)  # (SLOTS,)
        self._messages: list[str] = []

    def add(self, indices: torch.Tensor, expected: torch.Tensor) -> None:
        """Count the mismatches of ``(B,)`` ``indices`` against ``(B,)`` ``expected``."""
        # non_blocking only host -> device: a device -> host copy is read at once below
        moved = indices.to(self.device, non_blocking=self.device.type == "cuda")
        self.refuse(torch.ne(moved.reshape(-1), expected).any(), self.MISMATCH)

    def refuse(self, bad: torch.Tensor, message: str) -> None:
        """Count ``bad ()`` (a bool) as a refusal with ``message`` (one of at most ``SLOTS``)."""
        if message not in self._messages:
            if len(self._messages) == self.SLOTS:
                raise RuntimeError(f"IndexCheck: more than {self.SLOTS} kinds of refusal")
            self._messages.append(message)
        self.counts[self._messages.index(message)] += bad

    def raise_if_free(self) -> None:
        """:meth:`raise_if_bad` where the host reads the device for free (else later)."""
        if host_reads_allowed(self.device):
            self.raise_if_bad()

    def raise_if_bad(self) -> None:
        """Raise (and reset) the first refusal counted so far, if any."""
        counts = self.counts.tolist()
        if not any(counts):
            return
        self.counts.zero_()
        raise ValueError(next(m for m, c in zip(self._messages, counts, strict=False) if c))
