"""Sign kernels: decide the sign of a vector against an accumulator.

Both kernels are expressed as a per-vector *threshold* ``t`` on the dot product
``r = <v, acc>``: the sign is ``+`` iff ``r < t``.

* deterministic: ``t = 0`` (strict, so ``r = 0`` gives ``-``).
* probabilistic: ``+`` with probability ``clamp(1/2 - r / (2c), 0, 1)``. With
  ``u ~ U[0, 1)`` this is ``u < 1/2 - r/(2c)``, i.e. ``r < c (1 - 2u)``, so
  ``t = c (1 - 2u)``; the clamp is implied because ``0 <= u < 1``.

Thresholds are drawn for a whole step at once (they do not depend on earlier
signs), which keeps the sequential part of every variant free of random draws.

Scope of "orders do not depend on how an epoch is split into steps" with the probabilistic
kernel: the CPU only. The CPU generator draws one stream value after another, so several small
``torch.rand`` calls give the values of one large call. A CUDA generator advances its Philox
offset in rounded-up chunks per call, so on CUDA the thresholds, and the orders, depend on
the step sizes (a fixed split, as in every run of one config, still gives the same orders).
"""

from __future__ import annotations

import torch

from grab_exp.grads.rows import constant
from grab_exp.validation import check_choice, check_positive


class SignKernel:
    """Base class: produces the thresholds for ``count`` sign decisions.

    Args:
        c: the probabilistic kernel's scale (> 0; checked for every kernel).
    """

    name: str = ""

    def __init__(self, c: float = 30.0) -> None:
        check_positive("balance.c", c)
        self.c = float(c)

    def thresholds(
        self, count: int, generator: torch.Generator, dtype: torch.dtype, device: torch.device
    ) -> torch.Tensor:
        """Thresholds ``t`` such that the sign is ``+`` iff ``<v, acc> < t``.

        Returns:
            Tensor of shape ``(count,)``.
        """
        raise NotImplementedError


class DeterministicKernel(SignKernel):
    """``+`` iff ``<v, acc> < 0``."""

    name = "deterministic"

    def thresholds(self, count, generator, dtype, device):
        return constant(0.0, count, dtype, device)


class ProbabilisticKernel(SignKernel):
    """``+`` with probability ``clamp(1/2 - <v, acc>/(2c), 0, 1)`` (Alweiss et al.)."""

    name = "probabilistic"

    def thresholds(self, count, generator, dtype, device):
        u = torch.rand(count, generator=generator, dtype=dtype, device=device)  # (count,)
        return u.mul_(-2.0 * self.c).add_(self.c)


KERNELS = {k.name: k for k in (DeterministicKernel, ProbabilisticKernel)}


def make_kernel(kernel: str | SignKernel, c: float = 30.0) -> SignKernel:
    """Build a kernel from its name (``deterministic`` | ``probabilistic``)."""
    if isinstance(kernel, SignKernel):
        return kernel
    check_choice("balance.kernel", kernel, KERNELS)
    return KERNELS[kernel](c)


def signs_from(dots: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """Vectorized signs ``+1`` where ``dots < thresholds`` else ``-1`` (same dtype)."""
    plus, minus = (constant(value, 1, dots.dtype, dots.device) for value in (1.0, -1.0))
    return torch.where(dots < thresholds, plus, minus)
