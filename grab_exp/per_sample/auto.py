"""``method=auto``: the hook path while it gets the model right, else ``func``, else ``loop``.

When a path refuses or fails, on construction or on any call, :class:`AutoPerSample` removes its
hooks, puts back the buffers, frozen weights, attributes and random state that the call changed
(:func:`~.check.state.saved_state`) and takes the next path for that call and the rest (``loop``
announced by a ``UserWarning``). A model that none gets right is refused in one line with every
path's reason; ``LossContractError`` and ``UserCodeError`` at once."""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence

import torch

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.base import PLAIN_RUNS, PerSampleGradients, one_line
from grab_exp.per_sample.check.state import draws_since, generator_states, set_generator_states
from grab_exp.per_sample.layout import Inputs, batch_size, check_batch, listed_values
from grab_exp.per_sample.modules import (
    InputChangedError,
    LossContractError,
    ModuleSettingError,
    UnsupportedModelError,
    UserCodeError,
)

__all__ = ["AutoPerSample"]

#: a path ``auto`` may take: ``(method, build it)``
Path = tuple[str, Callable[[], PerSampleGradients]]
#: errors raised at once, whichever path runs
FINAL = (InputChangedError, LossContractError, ModuleSettingError, UserCodeError)


class AutoPerSample(PerSampleGradients):
    """The first of ``paths`` that builds (``chosen``), replaced by the next when a call of it
    refuses or fails; ``left``: ``method=<name>: <reason>`` of paths ruled out before (the hook
    path, by the model's structure); ``reason``: every path left, ``" | "``-joined."""

    def __init__(self, paths: Sequence[Path], left: Sequence[str] = ()) -> None:
        self._paths, self._left, self._warned = list(paths), list(left), False
        self._drawing = False  # numpy's or Python's generator moved in a call that read them
        self._hints: list[str] = []  # a call's likelier causes, said once after every reason
        self._said: list[str] = []  # those a path's reason gave
        self._next(UnsupportedModelError)  # the first path's other errors are raised as they are
        self.model, self.loss_fn = self.chosen.model, self.chosen.loss_fn

    @property
    def method(self) -> str:  # type: ignore[override]
        return self.chosen.method

    @property
    def checker(self):  # type: ignore[override]
        return self.chosen.checker

    @property
    def reason(self) -> str | None:
        return " | ".join(self._left) or None

    def __call__(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        check_batch(x, y)  # the same for every path: refused at once
        hints = (listed_values(x, batch_size(x)), PLAIN_RUNS)
        self._hints, self._said = [f" ({hint})" for hint in hints if hint], []
        while True:
            # the masks a failed call drew: the next path draws again (numpy's and Python's, a
            # copy of tens of microseconds, until the path's first call passed, and on every call
            # of a model seen drawing from them)
            rng = generator_states(others=not self._passed or self._drawing)
            try:
                result = self.chosen(x, y)
                if self.chosen.method == "loop" and not self._warned:  # announced once
                    self._warned = True
                    warnings.warn(
                        f"method=auto takes method=loop ({self.reason}); loop costs B forward "
                        "and backward passes of one example per step, besides the batch's",
                        stacklevel=2,  # a UserWarning
                    )
                self._passed = True
                self._drawing = self._drawing or (rng[-1] is not None and draws_since(rng)[1])
                return result
            except FINAL:
                raise
            except Exception as error:
                if not self._paths:  # the last path: one line with every path's reason
                    if self._left and isinstance(error, RuntimeError | ValueError):
                        raise self._refusal(self.method, error) from error
                    raise
                set_generator_states(rng)
                self.chosen._put_back()  # the model's and the loss's state it found
                self._left.append(self._reason(self.chosen.method, error))
                old = self.chosen
                self._next((RuntimeError, ValueError))  # none left to build: the old path stays
                getattr(old, "remove", lambda: None)()  # its hooks, once another path took over

    def _next(self, refused: type | tuple[type, ...]) -> None:
        """Build the next path; one whose construction raises ``refused`` is left as well."""
        while True:
            method, make = self._paths.pop(0)
            try:
                self.chosen, self._passed = make(), False
                return
            except FINAL:
                raise
            except refused as error:
                if not self._paths:
                    raise self._refusal(method, error) from error
                self._left.append(self._reason(method, error))

    def _reason(self, method: str, error: BaseException) -> str:
        reason = _reason(method, error)
        for hint in self._hints:
            if hint in reason:
                reason = reason.replace(hint, "")
                self._said += [] if hint in self._said else [hint]
        return reason

    def _refusal(self, method: str, error: BaseException) -> UnsupportedModelError:
        reasons = " | ".join([*self._left, self._reason(method, error)])
        return UnsupportedModelError(reasons + "".join(self._said))

    def state_bytes(self) -> int:
        return self.chosen.state_bytes()

    def remove(self) -> None:
        """Remove the chosen path's hooks from the model (this object is unusable afterwards)."""
        getattr(self.chosen, "remove", lambda: None)()

    def _compute(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        return self.chosen._compute(x, y)


def _reason(method: str, error: BaseException) -> str:
    """``method=<name>: <error's line>`` (without a ``method=...:`` prefix of its own)."""
    head, _, rest = one_line(error).partition(": ")
    return f"method={method}: {rest if head.startswith('method=') and rest else one_line(error)}"
