"""``method=auto``: the hook path while it gets the model right, else ``func``, else ``loop``.

When a call of a path refuses or fails (on any batch: which path is right shows only when it
runs), :class:`AutoPerSample` removes its hooks, puts back the buffers and random state that
call's forward changed and takes the next path for that call and the rest: the hook path (unless
the model's structure rules it out), ``func``, then ``loop``
(:class:`~grab_exp.per_sample.loop.LoopPerSample`, one example at a time), announced by one
``UserWarning`` naming why each faster path was left. A model that none gets right is refused in
one line with every path's reason; a loss that breaks the contract (``LossContractError``) and
the user's own error (``UserCodeError``) are raised at once.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.base import PerSampleGradients, one_line
from grab_exp.per_sample.layout import Inputs
from grab_exp.per_sample.modules import LossContractError, UnsupportedModelError, UserCodeError

__all__ = ["AutoPerSample"]

#: a path ``auto`` may take next: ``(method, build it)``
Fallback = tuple[str, Callable[[], PerSampleGradients]]


class AutoPerSample(PerSampleGradients):
    """The first path, replaced by the next when a call of it refuses or fails.

    Args:
        first: the path to try first (``hooks``, ``factored`` or ``func``).
        fallbacks: the paths to take after it, in order, built when needed.
        left: ``method=<name>: <reason>`` of paths ruled out before ``first`` (the hook path
            that the model's structure rules out).

    Attributes:
        chosen: the path in use.
        reason: why the paths before it were left, ``" | "``-joined (``None`` while the first
            path is in use).
    """

    def __init__(
        self, first: PerSampleGradients, fallbacks: Sequence[Fallback], left: Sequence[str] = ()
    ) -> None:
        self.model, self.loss_fn = first.model, first.loss_fn
        self.chosen: PerSampleGradients = first
        self._fallbacks = list(fallbacks)
        self._left = list(left)
        self._warned = False

    @property
    def method(self) -> str:  # type: ignore[override]
        """The chosen path's method (``hooks`` or ``factored`` until a call refuses it)."""
        return self.chosen.method

    @property
    def checker(self):  # type: ignore[override]
        """The chosen path's check schedule."""
        return self.chosen.checker

    @property
    def reason(self) -> str | None:
        """Why the paths before the chosen one were left (``None``: none was)."""
        return " | ".join(self._left) or None

    def check(self) -> None:
        self.chosen.check()

    def __call__(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        while self._fallbacks:
            buffers = _buffers(self.model)  # what a failed call's forward may change
            rng = torch.get_rng_state()  # and the masks it drew (the next path draws again)
            try:
                return self._called(x, y)
            except (LossContractError, UserCodeError):
                raise  # the loss is wrong for every method, or the user's code raised
            except Exception as error:  # any failure of this path
                torch.set_rng_state(rng)
                _put_back(buffers)
                self._leave(self.chosen.method, error)
                self._next()
        try:
            return self._called(x, y)
        except (LossContractError, UserCodeError):
            raise
        except (RuntimeError, ValueError) as error:  # UnsupportedModelError included
            if not self._left:
                raise
            raise self._refusal(self.chosen.method, error) from error

    def _called(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """The chosen path's call; the first that ``loop`` returns is announced."""
        result = self.chosen(x, y)
        if self.chosen.method == "loop" and not self._warned:
            self._warned = True
            warnings.warn(
                f"method=auto takes method=loop ({self.reason}); loop costs B forward and "
                "backward passes of one example per step, besides the batch's",
                UserWarning,
                stacklevel=3,
            )
        return result

    def _leave(self, method: str, error: BaseException) -> None:
        """Record why ``method`` was left and remove its hooks."""
        self._left.append(f"method={method}: {_without_method(one_line(error))}")
        remove = getattr(self.chosen, "remove", None)
        if remove is not None:
            remove()

    def _next(self) -> None:
        """Build the next path; one whose construction refuses the model is left as well (the
        last one's refusal is the final one, with every reason)."""
        while self._fallbacks:
            method, make = self._fallbacks.pop(0)
            try:
                self.chosen = make()
                return
            except (LossContractError, UserCodeError):
                raise
            except (RuntimeError, ValueError) as error:
                if not self._fallbacks:
                    raise self._refusal(method, error) from error
                self._left.append(f"method={method}: {_without_method(one_line(error))}")

    def _refusal(self, method: str, error: BaseException) -> UnsupportedModelError:
        """The final refusal: every path's reason, on one line."""
        last = f"method={method}: {_without_method(one_line(error))}"
        return UnsupportedModelError(" | ".join([*self._left, last]))

    def state_bytes(self) -> int:
        return self.chosen.state_bytes()

    def quiet(self):
        return self.chosen.quiet()

    def _compute(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        return self.chosen._compute(x, y)


def _buffers(model: nn.Module) -> list[tuple[nn.Module, str, torch.Tensor, int, torch.Tensor]]:
    """Every buffer as it is now: ``(module, name, tensor, version, copy)`` (running statistics,
    counters, a queue: what a forward may change in place or assign anew)."""
    return [
        (m, name, b, b._version, b.detach().clone())
        for m in model.modules()
        for name, b in m._buffers.items()
        if b is not None
    ]


@torch.no_grad()
def _put_back(buffers: list[tuple[nn.Module, str, torch.Tensor, int, torch.Tensor]]) -> None:
    """The buffers as :func:`_buffers` saw them."""
    for m, name, b, version, saved in buffers:
        m._buffers[name] = b
        if b._version != version:
            b.copy_(saved)


def _without_method(message: str) -> str:
    """A path's refusal without its ``method=...:`` prefix (auto's message names each path)."""
    head, _, rest = message.partition(": ")
    return rest if head.startswith("method=") and rest else message
