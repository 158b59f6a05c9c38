"""``method=auto`` at the first call: the hook path where it gets the model right, else ``func``.

Which path is right for a model shows only when it runs: the hook path probes the layers' layouts
and checks its first batch against a per-example computation
(:mod:`grab_exp.per_sample.verify`). :class:`AutoPerSample` starts with the hook path that
:func:`~grab_exp.per_sample.pipeline.resolve_method` picked from the model's structure; if its
first call refuses the model, it removes the hooks and takes ``func``, which is checked the same
way. A model that neither gets right is refused in one line with both reasons.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.base import PerSampleGradients
from grab_exp.per_sample.hooks import HookedPerSample
from grab_exp.per_sample.modules import UnsupportedModelError

__all__ = ["AutoPerSample"]


class AutoPerSample(PerSampleGradients):
    """The hook path, replaced by ``func`` if its first call refuses the model.

    Args:
        hooked: the hook path (``hooks`` or ``factored``) to try first.
        make_func: builds the ``func`` path, if it is needed.

    Attributes:
        chosen: the path in use.
    """

    def __init__(self, hooked: HookedPerSample, make_func: Callable[[], PerSampleGradients]):
        self.model, self.loss_fn = hooked.model, hooked.loss_fn
        self.chosen: PerSampleGradients = hooked
        self._make_func: Callable[[], PerSampleGradients] | None = make_func
        self.unverified = False  # each path checks its own first call

    @property
    def method(self) -> str:  # type: ignore[override]
        """The chosen path's method (``hooks`` or ``factored`` until a first call refuses it)."""
        return self.chosen.method

    def check(self) -> None:
        self.chosen.check()

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        if self._make_func is None:
            return self.chosen(x, y)
        make_func, self._make_func = self._make_func, None
        try:
            return self.chosen(x, y)
        except UnsupportedModelError as hooks_error:
            self.chosen.remove()
            try:
                self.chosen = make_func()
                return self.chosen(x, y)
            except (RuntimeError, ValueError) as func_error:  # UnsupportedModelError included
                raise UnsupportedModelError(
                    f"{hooks_error} | method=func: {func_error}".replace("\n", " ")
                ) from func_error

    def state_bytes(self) -> int:
        return self.chosen.state_bytes()

    def _compute(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        return self.chosen._compute(x, y)
