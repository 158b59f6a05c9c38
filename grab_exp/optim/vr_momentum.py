"""VR-Momentum: torch's SGD with momentum, fed the GSNR-scaled gradient ``r ⊙ ḡ``.

``d = r ⊙ ḡ + wd · θ`` (weight decay on the unscaled parameter, as in ``torch.optim.SGD``),
then exactly torch's momentum: ``b ← d`` on the first step, else ``b ← μ·b + (1 − τ)·d``;
``d ← d + μ·b`` with Nesterov, else ``d ← b``; ``θ ← θ − λ·d``. The operations mirror torch's
multi-tensor SGD one for one, so ``gamma = 1`` (every ratio exactly 1) reproduces
``torch.optim.SGD(lr, momentum, dampening, weight_decay, nesterov)`` bit for bit. The buffer is
stored as ``state[p]["momentum_buffer"]``, like torch's.
"""

from __future__ import annotations

from typing import Any

import torch

from grab_exp.optim.base import Group, GSNROptimizer, Tensors
from grab_exp.validation import check_below_one, check_non_negative

__all__ = ["VRMomentum"]


class VRMomentum(GSNROptimizer):
    """VR-Momentum (Jiang et al., 2023). Call ``observe(per_sample_grads)`` before ``step()``.

    Args:
        params: Parameters or param groups.
        lr: Learning rate ``λ`` (> 0).
        momentum: Momentum factor ``μ`` in ``[0, 1)``.
        dampening: Dampening ``τ`` in ``[0, 1)``.
        weight_decay: L2 penalty (>= 0), added to ``r ⊙ ḡ`` unscaled.
        nesterov: Nesterov momentum (needs ``momentum > 0`` and ``dampening = 0``).
        gamma: Lower clip of the scaled GSNR, in ``(0, 1]``.
        groups: GSNR groups per batch (>= 2, dividing the batch), ``None`` = batch size.
        eps: Relative variance regularizer of the GSNR (> 0).
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        momentum: float = 0.9,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
        *,
        gamma: float = 0.1,
        groups: int | None = None,
        eps: float = 1e-8,
    ) -> None:
        check_below_one("optimizer.momentum", momentum)
        check_below_one("optimizer.dampening", dampening)
        check_non_negative("optimizer.weight_decay", weight_decay)
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError(
                f"optimizer.nesterov: got true with momentum={momentum!r}, "
                f"dampening={dampening!r}; allowed: momentum > 0 and dampening = 0"
            )
        defaults = {
            "lr": lr,
            "momentum": momentum,
            "dampening": dampening,
            "weight_decay": weight_decay,
            "nesterov": nesterov,
        }
        super().__init__(params, defaults, gamma=gamma, groups=groups, eps=eps)

    def _momentum(self, group: Group, params: Tensors, step: Tensors) -> Tensors:
        """Update the buffers with ``step`` (torch's multi-tensor order); return them."""
        momentum, dampening = group["momentum"], group["dampening"]
        bufs = [self.state[p].get("momentum_buffer") for p in params]
        if all(b is not None for b in bufs):
            torch._foreach_mul_(bufs, momentum)
            torch._foreach_add_(bufs, step, alpha=1 - dampening)
            return bufs
        for i, (p, d) in enumerate(zip(params, step, strict=True)):
            if bufs[i] is None:
                bufs[i] = self.state[p]["momentum_buffer"] = d.detach().clone()
            else:
                bufs[i].mul_(momentum).add_(d, alpha=1 - dampening)
        return bufs

    def _update(self, group: Group, params: Tensors, grads: Tensors, ratios: Tensors) -> None:
        step = self._scaled_with_decay(group, params, grads, ratios)
        if group["momentum"] != 0:
            bufs = self._momentum(group, params, step)
            if group["nesterov"]:
                torch._foreach_add_(step, bufs, alpha=group["momentum"])
            else:
                step = bufs
        torch._foreach_add_(params, step, alpha=-group["lr"])
