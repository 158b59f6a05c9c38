"""The one interface of the per-sample paths, :class:`PerSampleGradients` (like opacus's
``AbstractGradSampleModule``)."""

from __future__ import annotations

import contextlib
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial
from typing import Any, ClassVar

import torch
from torch import nn

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.check.examples import alone_problem, mixing_problem
from grab_exp.per_sample.check.loss import example_losses, loss_of, loss_problem
from grab_exp.per_sample.check.mean import GradSnapshot, rows_problem
from grab_exp.per_sample.check.registrations import (
    ModelState,
    added_count,
    hooks_taken,
    registered_on,
)
from grab_exp.per_sample.check.resampled import resampled_problem, resampled_values_problem
from grab_exp.per_sample.check.rounding import alone_rounding, plain_rounding
from grab_exp.per_sample.check.schedule import CHECK_EVERY, Check
from grab_exp.per_sample.check.state import ExtraLoss, kept_state, saved_state
from grab_exp.per_sample.layout import (
    Inputs,
    SeenInputs,
    batch_size,
    call_model,
    check_batch,
    listed_values,
)
from grab_exp.per_sample.modules import (
    WATCHED,
    InputChangedError,
    LossContractError,
    ModuleSettingError,
    RelayedError,
    UnsupportedModelError,
    UserCodeError,
    advice,
    draws_random,
    first_line,
    module_problem,
)
from grab_exp.tracebacks import innermost_ours, raised_in_user_file
from grab_exp.validation import check_int_at_least

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: a path's identity check: ``(losses (B,), c (B,)) -> problem or None``
Identity = Callable[[torch.Tensor, torch.Tensor], "str | None"] | None


def one_line(error: Exception) -> str:
    """The error's first line, with its type unless it is a refusal (already one line)."""
    text = first_line(error)
    return text if isinstance(error, UnsupportedModelError) else f"{type(error).__name__}: {text}"


def user_code_error(
    model: nn.Module, loss_fn: LossFn, x: Inputs, y: torch.Tensor, error: Exception
) -> tuple[UserCodeError | None, bool]:
    """:class:`UserCodeError` when ``error`` was raised in a user's file and a plain step
    (``loss_fn(model(x), y)``) raises the same type in one, or when the plain step raises torch's
    ``error`` (:func:`same_error`) in its backward (a tensor saved for backward changed in place)
    or in torch code that the user's model or loss called, no code of ours between (a wrong
    shape handed to ``F.linear``, a class out of range), else ``None`` (a refusal stands); and
    whether the plain step ran without an error, its backward included (not run where the user's
    file raised ``error``: unknown, so ``False``)."""
    if (hooked := _returning_hook(model, error)) is not None:
        return UserCodeError("model", hooked, error), False
    own, backward = raised_in_user_file(error), False
    setting, obj = "model", model
    try:
        with torch.enable_grad():
            out = call_model(model, x)
            setting, obj = "loss", loss_fn
            loss = loss_fn(out, y)
            setting, obj, backward = "model", model, True
            if not own and isinstance(loss, torch.Tensor) and loss.grad_fn is not None:
                _plain_backward(model, loss)
    except Exception as plain:  # the user's code fails without any method
        called = backward or innermost_ours(plain) in (user_code_error.__code__, CALL_MODEL)
        same = raised_in_user_file(plain) if own else called and same_error(plain, error)
        if type(plain) is type(error) and same:
            named = obj if callable(obj) and hasattr(obj, "__qualname__") else type(obj)
            return UserCodeError(setting, f"{named.__module__}.{named.__qualname__}", plain), False
        return None, False
    return None, not own


def _returning_hook(model: nn.Module, error: Exception) -> str | None:
    """The post-accumulate-grad hooks of the parameters with one, where ``error`` is torch's
    refusal of such a hook's return value (``lambda p: p.data.add_(...)``, a fused step): a plain
    step raises it too, but the one :func:`user_code_error` runs takes those hooks away (they may
    step an optimizer); ``None`` otherwise (adversarial round 42)."""
    if "post accumulate grad hooks should return None" not in str(error):
        return None
    named = [n for n, p in model.named_parameters() if p._post_accumulate_grad_hooks]
    more = ", ..." if len(named) > 3 else ""
    return f"a post-accumulate-grad hook (of {', '.join(named[:3])}{more})" if named else None


#: what a method's failure adds where a plain step of the batch raises nothing
PLAIN_RUNS = (
    "a plain step of the batch raises nothing; every method also runs the model and the loss on "
    "one example alone or on copies of one, which a model or loss that needs the whole batch, as "
    "in-batch negatives or offsets into a flat input, cannot take"
)
#: refusals of ours, which a refusal's cause that a plain step may raise too is not
OURS = (UnsupportedModelError, LossContractError)
#: the frame of ours that a plain forward's error passes last when the user's code raised it
CALL_MODEL = call_model.__code__
NUMBERS = re.compile(r"\d+")


def same_error(plain: Exception, error: Exception) -> bool:
    """Whether two errors are one: the type and first line, but for their numbers (a shape of
    the batch's, which a method's own batch of 1 or 2 examples changes)."""
    lines = (NUMBERS.sub("#", first_line(e)) for e in (plain, error))
    return type(plain) is type(error) and next(lines) == next(lines)


def _plain_backward(model: nn.Module, loss: torch.Tensor) -> None:
    """``loss.backward()`` (not ``autograd.grad``: a reentrant checkpoint refuses it), with every
    ``param.grad`` as it was afterwards and no post-accumulate-grad hook run (an optimizer step
    fused into backward would move the parameters, which nothing puts back)."""
    grads = [(p, p.grad) for p in model.parameters()]
    for p, _ in grads:
        p.grad = None
    try:
        with hooks_taken(p._post_accumulate_grad_hooks for p, _ in grads):
            loss.backward()
    finally:
        for p, g in grads:
            p.grad = g


class PerSampleGradients(ABC):
    """Per-sample gradients of ``model``'s loss ``loss_fn(out, y)``, the batch MEAN of
    per-example losses; subclasses implement :meth:`_compute` and name their ``method``.
    ``check_every``: the checks' period (:class:`~.check.schedule.Check`; ``0``: none);
    ``randomness``: vmap's for random layers (``None``: active dropout is refused)."""

    method: ClassVar[str]
    randomness: str | None = None
    #: whether active Dropout is right without a ``randomness`` (the hook path: the batch's masks)
    module_dropout: ClassVar[bool] = False
    #: whether the rows come from the batch's one backward (the hook path: a full check compares
    #: one example's row with the gradient of its loss alone), not from each example alone
    one_backward: ClassVar[bool] = False
    #: what the rows' mean check allows for float32's rounding (:mod:`.check.rounding`)
    rows_rounding: ClassVar[Callable] = staticmethod(plain_rounding)

    def __init__(self, model: nn.Module, loss_fn: LossFn, check_every: int = CHECK_EVERY) -> None:
        check_int_at_least("pipeline.check_every", check_every, 0)
        self.model, self.loss_fn, self.extra_loss = model, loss_fn, ExtraLoss(loss_fn, model)
        self.checker, self.state = Check(check_every), ModelState(model)
        self.restructure()
        self.check()

    def check(self) -> None:
        for name, module in self._watched:
            if problem := module_problem(name, module, self.randomness, self.module_dropout):
                raise ModuleSettingError(problem)

    def __call__(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """The detached mean loss and the :class:`~grab_exp.grads.batch.BatchGrads` of the
        trainable parameters (``named_parameters`` order) of inputs ``x`` (a tensor, or a tuple
        or dict of tensors, the batch in dimension 0) and targets ``y``; adds the batch's mean
        gradient to ``param.grad`` as ``loss.backward()`` would. ``UnsupportedModelError``: one
        line naming the cause, ``param.grad`` as before the call; ``UserCodeError``: the user's
        model or loss raised, and a plain step raises the same."""
        check_batch(x, y)
        self._seen = SeenInputs(x, y, self.checker.on)  # what a forward or loss changes in place
        self._found = saved_state(self.model)  # for the examples alone and auto's retry
        self.extra_loss.begin()  # the loss's state, for its calls besides the batch's own
        if self.state.stale(self.model):  # a module or parameter was replaced since
            state, self.state = self.state, ModelState(self.model)
            try:
                self.restructure()
            except UnsupportedModelError:
                state._seen, self.state = -1, state  # stale again: refused on every call
                raise
        self.check()
        if not any(p.requires_grad for p in self.state.params):  # all frozen (since the last call)
            raise UnsupportedModelError("the model has no trainable parameter (requires_grad=True)")
        self._registered, self._versions = added_count(), [p._version for p in self.state.params]
        try:
            result = self._compute(x, y)
            self.refuse_registered()  # func's drawn path: param.grad from the rows
        except UnsupportedModelError as error:
            self.checker.forget()  # refused: every kind of batch is checked in full again
            self.refuse_registered(error)
            self.refuse_changed(error)  # the cause of any refusal after the change
            cause = error.__cause__  # where torch's error is relayed: does a plain step raise it?
            relayed = isinstance(error, RelayedError)
            if relayed or (cause is not None and not isinstance(cause, OURS)):
                own, ran = self._plain_step(x, y, cause or error)
                if own is not None:
                    raise own from cause
                if relayed and ran:
                    raise RelayedError(f"{first_line(error)} ({PLAIN_RUNS})") from cause
            self._put_back()
            raise
        except Exception as error:  # torch's, the model's or the loss's, inside this method
            self.refuse_registered(error)
            self.refuse_changed(error)  # a plain step would run on what was changed
            own, ran = user_code_error(self.model, self.loss_fn, x, y, error)  # then put back
            self._put_back()
            if own is not None:
                raise own from error
            hint = listed_values(x, batch_size(x)) or (PLAIN_RUNS if ran else "")
            hint = f" ({hint})" if hint else ""  # a likelier cause than torch's message
            raise RelayedError(f"method={self.method}: {one_line(error)}{hint}") from error
        return result

    def _plain_step(
        self, x: Inputs, y: torch.Tensor, error: Exception
    ) -> tuple[UserCodeError | None, bool]:
        """:func:`user_code_error` of torch's ``error`` relayed by a refusal (a plain step of the
        batch raises it too: the user's code fails without any method), the state put back."""
        found = user_code_error(self.model, self.loss_fn, x, y, error)
        self._put_back()
        return found

    def refuse_registered(self, error: Exception | None = None) -> None:
        """Refuse a call during which the model's forward registered a module or parameter (a
        head made on the first call): rows cover the parameters the call started with. What was
        registered is taken away with the rest of the state (:meth:`_put_back`)."""
        if added_count() == self._registered:  # no new name on a watched module
            return
        if (made := registered_on(self.state.ids, self._registered)) is None:
            return  # on modules of other models (a copy, a layer made for a moment)
        self._put_back()
        raise UnsupportedModelError(
            f"the model's forward registered {made} during the call (self.head = "
            "nn.Linear(...) in forward): per-sample rows cover the parameters a call starts "
            "with; make it in __init__, or run one plain forward before make_per_sample"
        ) from error

    def refuse_changed(self, error: Exception | None = None, read: bool = True) -> None:
        """Refuse a call whose model or loss changed its inputs or targets in place
        (:class:`~.layout.SeenInputs`; ``read``: off the CPU, their values too), with the model's
        and the loss's state put back."""
        if isinstance(error, InputChangedError) or (where := self._seen.changed(read)) is None:
            return
        self._put_back()
        raise InputChangedError(where) from error

    def _put_back(self) -> None:
        """A call that raises leaves the model's and the loss's state as it found them (what
        can be put back: not a tensor that a forward changed in place for the first time)."""
        with contextlib.suppress(UnsupportedModelError):
            self._found()
        self.extra_loss.back()

    def restructure(self) -> None:
        self._watched = [(n, m) for n, m in self.model.named_modules() if isinstance(m, WATCHED)]
        dtypes = {p.dtype: n for n, p in reversed(self.state.named) if p.requires_grad}  # firsts
        if complex_ := [(d, n) for d, n in dtypes.items() if d.is_complex]:
            raise ModuleSettingError(
                f"{complex_[0][1]} is a trainable {complex_[0][0]} parameter: per-sample rows are "
                "real vectors (an ordering's inner products and signs); train its real and "
                "imaginary parts as a real parameter (torch.view_as_complex of a (..., 2) one)"
            )
        if len(dtypes) > 1:  # the rows are one (B, d) matrix
            two = " and ".join(f"{n} ({d})" for d, n in list(dtypes.items())[:2])
            raise ModuleSettingError(
                f"trainable parameters of two dtypes, {two}: the per-sample rows are one (B, d) "
                "matrix of one dtype; cast the model to one dtype (model.float()) or freeze a part"
            )

    def state_bytes(self) -> int:
        """Bytes the path keeps between calls (the hook path's reused ``(B, d)`` buffer)."""
        return 0

    def quiet(self) -> contextlib.AbstractContextManager:
        """The model runs as a plain model inside (a path's hooks idle)."""
        return contextlib.nullcontext()

    def verify_and_check(
        self,
        batch: tuple[Inputs, Any],
        rows: BatchGrads,
        params: dict[str, nn.Parameter],
        snapshot: GradSnapshot,
        full: Callable[[Identity], None] | None,
        identity: Identity,
        sums: dict[str, Callable] | None = None,
    ) -> None:
        """The rows' mean against this call's ``param.grad`` (:mod:`.check.mean`; ``sums``: its
        compact sums; ``batch``: the call's ``x, y``, for a plain step's rounding), then
        ``full(identity)`` where one is due; where the mean is off, ``full(None)`` first (its loss
        and mixing checks name a cause, the identity would not)."""
        self.refuse_registered()  # before param.grad stays
        self.refuse_changed(read=full is not None)  # off the CPU, values on checked calls
        problem = None
        if self.checker.on:
            self._refuse_stepped()
            rounding = partial(
                self.rows_rounding, self.model, self.extra_loss, *batch, found=self._found
            )
            scratch = self.checker.scratch(rows.width, rows.like)
            args = (self.model, self.method, scratch, sums, rounding)
            problem = rows_problem(rows, params, snapshot, *args)
        if isinstance(problem, torch.Tensor):  # CUDA: judged at the next full check
            self.checker.defer_rows(problem)
        elif problem is not None:
            if full is not None:
                full(None)
            raise UnsupportedModelError(problem)
        if full is not None:
            full(identity)

    def _refuse_stepped(self) -> None:
        """Refuse a parameter that its post-accumulate-grad hook changed during the call's
        backward (an optimizer step fused into backward): the checks' forwards run on the
        parameters the call found, which it cannot put back."""
        pairs = zip(self.state.named, self._versions, strict=True)
        stepped = [n for (n, p), v in pairs if p._version != v and p._post_accumulate_grad_hooks]
        if stepped:
            raise UnsupportedModelError(
                f"{stepped[0]} was changed during the call's backward by its post-accumulate-grad "
                "hook (an optimizer step fused into backward): the checks run the model on the "
                "parameters the call found; step after the call, or check_every=0"
            )

    def full_check(
        self, x: Inputs, y, out, layout, identity: Identity, rows=None, params=None
    ) -> None:
        """The full check of the batch ``x, y`` (:mod:`~grab_exp.per_sample.check`), ``out`` its
        output in its forward's graph; ``identity``: ``None`` where the rows cannot be compared
        with that graph (other random masks). An output the batch cannot split: the rows (of
        ``params``) against resampled batches (:mod:`~grab_exp.per_sample.check.resampled`)."""
        batch, checker, loss_fn = batch_size(y), self.checker, self.extra_loss
        loss = loss_of(loss_fn, out, y)  # first: a loss that changes its input is named
        checker.settle_deferred()  # the loss splits of the calls since
        # a loss not finite (a diverged step, which the runner stops on) has no split and no
        # identity; the outputs and an example alone (its finite gradients) are still compared
        finite, whole = bool(torch.isfinite(loss)), layout.unbatched(out)
        if finite and not whole:
            losses = example_losses(loss_fn, out, y, layout)  # (B,), in out's graph
            if (problem := loss_problem(loss.detach(), losses.detach())) is not None:
                raise LossContractError(problem)
        compared = identity is not None and finite and not whole
        problem = None
        with kept_state(self.model), contextlib.ExitStack() as quiet:
            # the identity on the batch's graph first: a forward below may change in place what
            # it saved (a momentum encoder's frozen weights); its backward's state (a backward
            # hook's count, a kept gradient) put back too; named after the checks naming a cause
            identified = self._identified(identity, losses, checker) if compared else None
            quiet.enter_context(self.quiet())
            # each extra forward on the attributes the call found (_found() returns None)
            forward = lambda inputs: self._found() or call_model(self.model, inputs)  # noqa: E731
            if batch >= 2:
                groups = checker.groups(batch)
                problem = mixing_problem(forward, x, out, layout, groups, self.model, self._found)
            if problem is None and batch >= 2 and whole and finite:  # masks differ: values
                random = rows is None or any(map(draws_random, self.model.modules()))
                data = (batch, self.model) if random else (rows, params)
                check = resampled_values_problem if random else resampled_problem
                problem = check(forward, loss_fn, x, y, *data, checker.checks)
            problem = problem or identified
            if identity is not None and problem is None and batch >= 2 and self.one_backward:
                rounding = partial(alone_rounding, self.model, loss_fn, x, y, found=self._found)
                args = (rows, params, checker, self.method, rounding, layout, self.model)
                problem = alone_problem(forward, loss_fn, x, y, *args)
        if problem is not None:
            raise UnsupportedModelError(problem)

    def _identified(self, identity: Callable, losses: torch.Tensor, checker: Check) -> str | None:
        """``identity(losses, c)``: a backward through the batch's graph again (retained), which
        a custom ``autograd.Function`` that frees what it saved cannot run: named as seen."""
        try:
            return identity(losses, checker.weights(len(losses), losses))
        except UnsupportedModelError:
            raise
        except Exception as error:
            raise UnsupportedModelError(
                f"the check's second backward through the batch's graph raised {one_line(error)} "
                "(a custom autograd.Function whose backward runs once?), with which the check "
                f"compares the rows; {advice(self.method)}"
            ) from error

    @abstractmethod
    def _compute(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """:meth:`__call__` after the modules' modes are checked."""
