"""VR-Adam: Adam fed the gradient scaled by a bias-corrected running average of the GSNR.

The paper's appendix with the exact VR-Adam pseudo-code was not available to us; this variant
is **our choice**, following the paper's description (GSNR-scaled gradient into Adam):

    p_t = β3 · p_{t−1} + (1 − β3) · r_t,   p_0 = 0        (β3 = 0.9)
    p̂_t = p_t / (1 − β3^t)
    g_t = p̂_t ⊙ ḡ_t + wd · θ                               (torch.optim.Adam's L2 weight decay)
    m_t, v_t, θ_t: exactly torch.optim.Adam's (amsgrad off) with ``adam_eps`` in the denominator

Implementation: we store ``e_t = p_t − (1 − β3^t)``, which obeys the same recursion with input
``r_t − 1`` (``e_t = β3·e_{t−1} + (1 − β3)(r_t − 1)``, ``e_0 = 0``), so
``p̂_t = 1 + e_t / (1 − β3^t)`` - mathematically identical, and exactly 1 when every ``r`` is 1
(then ``e`` stays exactly 0). The step's input ``ḡ + (e_t / (1 − β3^t)) ⊙ ḡ`` takes four passes
over the tensors before Adam's (the lerp and the ``− (1 − β3)`` of ``e``, the division, one
``addcmul``), and is exactly ``ḡ`` when ``e`` is 0.
Hence ``gamma = 1`` reproduces ``torch.optim.Adam(lr, betas, eps=adam_eps, weight_decay,
capturable=True, foreach=True)`` bit for bit where torch runs that (CUDA): the step counts are
device tensors and the Adam operations mirror torch's capturable multi-tensor Adam one for one
(its single-tensor path orders them otherwise, so rounds otherwise), so a step
reads no host value and can be captured in a CUDA graph. On the CPU, where torch's Adam keeps
its step count on the host, the two agree to rounding (the bias corrections are computed in
the parameters' precision rather than in Python's double). ``eps`` is the GSNR regularizer, as
in the other VR optimizers; Adam's own epsilon is ``adam_eps``.
"""

from __future__ import annotations

from typing import Any

import torch

from grab_exp.optim.base import Group, GSNROptimizer, Tensors, device_step
from grab_exp.validation import check_below_one, check_non_negative

__all__ = ["VRAdam"]


class VRAdam(GSNROptimizer):
    """VR-Adam (our variant, see the module docstring). Call ``observe()`` before ``step()``.

    Args:
        params: Parameters or param groups.
        lr: Learning rate (> 0).
        betas: Adam's ``(β1, β2)``, each in ``[0, 1)``.
        adam_eps: Adam's denominator epsilon (>= 0).
        weight_decay: L2 penalty (>= 0), added to ``p̂ ⊙ ḡ`` unscaled.
        beta3: Decay of the GSNR's running average, in ``[0, 1)``.
        gamma: Lower clip of the scaled GSNR, in ``(0, 1]``.
        groups: GSNR groups per batch (>= 2, dividing the batch), ``None`` = batch size.
        eps: Relative variance regularizer of the GSNR (> 0).
    """

    def __init__(
        self,
        params: Any,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        adam_eps: float = 1e-8,
        weight_decay: float = 0.0,
        beta3: float = 0.9,
        *,
        gamma: float = 0.1,
        groups: int | None = None,
        eps: float = 1e-8,
    ) -> None:
        listed = hasattr(betas, "__len__") and hasattr(betas, "__iter__")  # a ListConfig too
        betas = tuple(betas) if listed and not isinstance(betas, (str, bytes)) else ()
        if len(betas) != 2:
            raise ValueError(f"optimizer.betas: got {betas!r}; allowed: two numbers in [0, 1)")
        for i, beta in enumerate(betas):
            check_below_one(f"optimizer.betas[{i}]", beta)
        check_non_negative("optimizer.adam_eps", adam_eps)
        check_non_negative("optimizer.weight_decay", weight_decay)
        check_below_one("optimizer.beta3", beta3)
        defaults = {
            "lr": lr,
            "betas": betas,
            "adam_eps": adam_eps,
            "weight_decay": weight_decay,
            "beta3": beta3,
        }
        super().__init__(params, defaults, gamma=gamma, groups=groups, eps=eps)

    def _states(self, params: Tensors) -> list[dict[str, Any]]:
        states = []
        for p in params:
            state = self.state[p]
            if not state:
                state["step"] = device_step(0, p)
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["gsnr_dev"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            elif not torch.is_tensor(state["step"]) or state["step"].device != p.device:
                state["step"] = device_step(state["step"], p)  # an older or CPU-mapped state
            states.append(state)
        return states

    def _update(self, group: Group, params: Tensors, grads: Tensors, ratios: Tensors) -> None:
        beta1, beta2 = group["betas"]
        beta3 = group["beta3"]
        states = self._states(params)
        steps = [s["step"] for s in states]  # () device tensors
        exp_avgs = [s["exp_avg"] for s in states]
        exp_avg_sqs = [s["exp_avg_sq"] for s in states]
        devs = [s["gsnr_dev"] for s in states]  # e_t = p_t − (1 − β3^t)
        torch._foreach_add_(steps, 1)
        # e_t = β3 e + (1 − β3)(r − 1): the lerp towards r, less (1 − β3); no r − 1 temporaries
        torch._foreach_lerp_(devs, ratios, 1 - beta3)
        torch._foreach_sub_(devs, 1 - beta3)
        scale = torch._foreach_div(devs, _one_minus_powers(beta3, steps))  # p̂_t − 1
        g = torch._foreach_addcmul(grads, grads, scale)  # p̂_t ⊙ ḡ = ḡ + (p̂_t − 1) ⊙ ḡ
        self._with_decay(group, params, g)  # + wd · θ
        # from here torch's capturable multi-tensor Adam, operation for operation
        torch._foreach_lerp_(exp_avgs, g, 1 - beta1)
        torch._foreach_mul_(exp_avg_sqs, beta2)
        torch._foreach_addcmul_(exp_avg_sqs, g, g, 1 - beta2)
        step_size = torch._foreach_pow(beta1, steps)
        torch._foreach_sub_(step_size, 1)
        torch._foreach_div_(step_size, group["lr"])
        torch._foreach_reciprocal_(step_size)  # -lr / (1 - β1^t)
        correction = _one_minus_powers(beta2, steps)
        torch._foreach_sqrt_(correction)  # sqrt(1 - β2^t)
        denom = torch._foreach_sqrt(exp_avg_sqs)
        torch._foreach_div_(denom, correction)
        torch._foreach_add_(denom, group["adam_eps"])
        torch._foreach_div_(denom, step_size)
        torch._foreach_addcdiv_(params, exp_avgs, denom)


def _one_minus_powers(beta: float, steps: list[torch.Tensor]) -> list[torch.Tensor]:
    """``1 - beta^t`` for each ``() `` step count ``t``, on its device (torch's order)."""
    powers = torch._foreach_pow(beta, steps)
    torch._foreach_sub_(powers, 1)
    torch._foreach_neg_(powers)
    return powers
