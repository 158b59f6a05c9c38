"""``method=auto``: the hook path while it gets the model right, else ``func``.

When a call of the hook path refuses or fails (on any batch: which path is right shows only when
it runs), :class:`AutoPerSample` removes the hooks, puts back the buffers and random state that
call's forward changed and takes ``func`` for that call and the rest; a model that neither gets
right is refused in one line with both reasons.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.base import PerSampleGradients, one_line
from grab_exp.per_sample.hooks import HookedPerSample
from grab_exp.per_sample.layout import Inputs
from grab_exp.per_sample.modules import LossContractError, UnsupportedModelError, UserCodeError

__all__ = ["AutoPerSample"]


class AutoPerSample(PerSampleGradients):
    """The hook path ``hooked``, replaced by ``make_func()`` when a call of it refuses or fails;
    ``chosen``: the path in use, ``reason``: why the hook path was left (``None``: it is not)."""

    def __init__(self, hooked: HookedPerSample, make_func: Callable[[], PerSampleGradients]):
        self.model, self.loss_fn = hooked.model, hooked.loss_fn
        self.chosen: PerSampleGradients = hooked
        self.checker = hooked.checker
        self.reason: str | None = None
        self._make_func: Callable[[], PerSampleGradients] | None = make_func
        #: the modules whose forward in training mode updates running statistics
        self._norms = [
            m for m in hooked.state.modules if isinstance(m, nn.modules.batchnorm._NormBase)
        ]

    @property
    def method(self) -> str:  # type: ignore[override]
        """The chosen path's method (``hooks`` or ``factored`` until a call refuses it)."""
        return self.chosen.method

    def check(self) -> None:
        self.chosen.check()

    def __call__(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        if self._make_func is None:
            return self.chosen(x, y)
        buffers = _running_buffers(self._norms)  # what a failed call's forward may update
        rng = torch.get_rng_state()  # and the masks it drew (func draws them again)
        try:
            return self.chosen(x, y)
        except (LossContractError, UserCodeError):
            raise  # the loss is wrong for every method, or the user's code raised
        except Exception as hooks_error:  # any failure of the hook path
            torch.set_rng_state(rng)
            with torch.no_grad():
                for buffer, saved in buffers:
                    buffer.copy_(saved)
            left = self.chosen.method
            self.chosen.remove()
            make_func, self._make_func = self._make_func, None
            self.reason = _without_method(one_line(hooks_error))
            try:
                self.chosen = make_func()
                return self.chosen(x, y)
            except (RuntimeError, ValueError) as func_error:  # UnsupportedModelError included
                raise UnsupportedModelError(
                    f"method={left}: {self.reason} | method=func: "
                    f"{_without_method(one_line(func_error))}"
                ) from func_error

    def state_bytes(self) -> int:
        return self.chosen.state_bytes()

    def _compute(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        return self.chosen._compute(x, y)


def _running_buffers(norms: list[nn.Module]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Copies of the running statistics that a forward of ``norms`` in training mode updates."""
    return [
        (b, b.detach().clone())
        for m in norms
        if m.training and m.track_running_stats
        for b in m.buffers(recurse=False)
    ]


def _without_method(message: str) -> str:
    """A path's refusal without its ``method=...:`` prefix (auto's message names each path)."""
    head, _, rest = message.partition(": ")
    return rest if head.startswith("method=") and rest else message
