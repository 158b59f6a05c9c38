"""VR-SGD: plain SGD whose step is scaled element-wise by the clipped GSNR.

``θ ← θ − λ · (r ⊙ ḡ + wd · θ)`` with ``ḡ = p.grad`` (the batch's mean gradient) and ``r`` the
scaled, clipped GSNR of the step (see :mod:`grab_exp.optim.gsnr`). Weight decay, off by
default, is torch's L2 form on the unscaled parameter. With ``gamma = 1`` every ratio is exactly
1 and the update is bit-for-bit ``torch.optim.SGD(lr, weight_decay=wd)`` without momentum.
"""

from __future__ import annotations

from typing import Any

import torch

from grab_exp.optim.base import Group, GSNROptimizer, Tensors
from grab_exp.validation import check_non_negative

__all__ = ["VRSGD"]


class VRSGD(GSNROptimizer):
    """VR-SGD (Jiang et al., 2023). Call ``observe(per_sample_grads)`` before each ``step()``.

    Args:
        params: Parameters or param groups.
        lr: Learning rate ``λ`` (> 0).
        weight_decay: L2 penalty (>= 0), added to ``r ⊙ ḡ`` unscaled.
        gamma: Lower clip of the scaled GSNR, in ``(0, 1]``.
        groups: GSNR groups per batch (>= 2, dividing the batch), ``None`` = batch size.
        eps: Relative variance regularizer of the GSNR (> 0).
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        *,
        gamma: float = 0.1,
        groups: int | None = None,
        eps: float = 1e-8,
    ) -> None:
        check_non_negative("optimizer.weight_decay", weight_decay)
        defaults = {"lr": lr, "weight_decay": weight_decay}
        super().__init__(params, defaults, gamma=gamma, groups=groups, eps=eps)

    def _update(self, group: Group, params: Tensors, grads: Tensors, ratios: Tensors) -> None:
        step = self._scaled_with_decay(group, params, grads, ratios)
        torch._foreach_add_(params, step, alpha=-group["lr"])
