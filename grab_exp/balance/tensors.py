"""What ``Ordering.step`` checks beside the gradients (:mod:`grab_exp.grads`): dtypes, indices."""

from __future__ import annotations

import torch

from grab_exp.validation import check_choice

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` / ``torch.float64`` from a dtype or its name."""
    if isinstance(dtype, torch.dtype):
        check_choice("balance.dtype", str(dtype).removeprefix("torch."), DTYPES)
        return dtype
    check_choice("balance.dtype", dtype, DTYPES)
    return DTYPES[dtype]


class IndexCheck:
    """Counts ``step`` indices that differ from the order's next ones.

    On the CPU a mismatch raises at once; on CUDA the count stays on the device (no
    synchronization inside ``step``) until ``raise_if_bad`` (state_dict, next epoch).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bad = torch.zeros((), dtype=torch.long, device=device)

    def add(self, indices: torch.Tensor, expected: torch.Tensor) -> None:
        """Count the mismatches of ``(B,)`` ``indices`` against ``(B,)`` ``expected``."""
        # non_blocking only host -> device: a device -> host copy is read at once below
        moved = indices.to(self.device, non_blocking=self.device.type == "cuda")
        self.bad += (moved.reshape(-1) != expected).sum()
        if self.device.type == "cpu":  # free to check now; on CUDA defer (no sync in step)
            self.raise_if_bad()

    def raise_if_bad(self) -> None:
        """Raise (and reset) when any index so far was not the expected one."""
        if self.bad.item():
            self.bad.zero_()
            raise ValueError(
                "step: indices are not the next ones of the current order; iterate the "
                "sampler (or index_batches) and step each batch once, in order"
            )
