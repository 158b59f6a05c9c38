"""``method=func``: whole-model per-sample gradients with ``torch.func`` (``vmap(grad)``): any
model (tied weights, parameters used outside their module), no host synchronization on CUDA."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.nn.utils import parametrize
from torch.utils._pytree import tree_flatten, tree_map, tree_unflatten

from grab_exp.devices import in_graph_safe
from grab_exp.grads import BatchGrads, as_batch_grads
from grab_exp.per_sample.base import LossFn, PerSampleGradients
from grab_exp.per_sample.check.examples import identity_problem
from grab_exp.per_sample.check.loss import check_scalar, loss_of, relative_gap
from grab_exp.per_sample.check.mean import GradSnapshot, refuse_gradient_hooks
from grab_exp.per_sample.check.schedule import CHECK_EVERY
from grab_exp.per_sample.check.state import (
    draws_since,
    forked_generators,
    generator_states,
    kept_state,
    saved_state,
    set_generator_states,
)
from grab_exp.per_sample.check.tolerance import autocast_on
from grab_exp.per_sample.compiled import compile_step
from grab_exp.per_sample.layout import (
    Inputs,
    OutputLayout,
    batch_size,
    call_model,
    input_shapes,
    take,
)
from grab_exp.per_sample.modules import (
    CHECKPOINT_REFUSAL,
    UnsupportedModelError,
    compiled,
    first_line,
    random_modules,
)
from grab_exp.tracebacks import raised_in
from grab_exp.validation import check_choice, check_int_at_least

__all__ = ["RANDOMNESS_CHOICES", "FuncPerSample"]

Grads = dict[str, torch.Tensor]

#: Layers whose kernels torch's vmap may fail on (named when it does).
VMAP_FAILS = (nn.RNNBase, nn.RNNCellBase)

#: why func refuses a forward that draws from numpy's or Python's generator, where it does
DRAWN_ELSEWHERE = (
    "the forward draws from numpy's or Python's random generator, which torch.func's vmap draws "
    "from once for all the examples (one draw shared), not as the batch's forward does"
)
#: what reads the batch's own draws
HOOKS_DRAW = "use method=hooks (the batch's own draws)"
#: Explicit values of vmap's ``randomness`` that allow random layers (dropout).
RANDOMNESS_CHOICES = ("different", "same")


def split_state(
    module: nn.Module, names: Iterable[str] | None = None, copy_buffers: bool = False
) -> tuple[Grads, Grads]:
    """``(trainable, fixed)``, detached: the trainable parameters among ``names`` (default: all),
    and the rest and the buffers (copies with ``copy_buffers``: a replay cannot update them)."""
    params = dict(module.named_parameters())
    chosen = params if names is None else names
    trainable = {n: params[n].detach() for n in chosen if params[n].requires_grad}
    fixed = {n: p.detach() for n, p in params.items() if n not in trainable}
    fixed.update((n, b.clone() if copy_buffers else b.detach()) for n, b in module.named_buffers())
    return trainable, fixed


def _make_grad_fn(
    model: nn.Module, loss_fn: LossFn, chunk_size: int | None, randomness: str | None
) -> Callable[[Grads, Grads, Inputs, torch.Tensor], tuple[Grads, torch.Tensor]]:
    """``vmap(grad(loss of one example))`` over dimension 0 of every tensor leaf of ``x`` and
    ``y`` that has one (Python values and ``()`` tensors go to every example as they are)."""
    model_and_loss = _ModelAndLoss(model, loss_fn)

    def batched(trainable: Grads, fixed: Grads, x: Inputs, y: torch.Tensor):
        dims = tree_map(lambda t: 0 if isinstance(t, torch.Tensor) and t.dim() else None, (x, y))
        found = saved_state(model, buffers=False) if chunk_size is not None else None

        def one_example(trainable: Grads, fixed: Grads, xi: Inputs, yi: torch.Tensor):
            if found is not None:  # vmap runs it once per chunk: each from the call's attributes
                found()
            one, y1 = tree_map(lambda t, d: t if d is None else t.unsqueeze(0), (xi, yi), dims)
            state = [{f"model.{n}": t for n, t in part.items()} for part in (trainable, fixed)]
            loss, out = functional_call(model_and_loss, tuple(state), (one, y1))
            check_scalar(loss)
            detached = tree_map(lambda t: t.detach() if isinstance(t, torch.Tensor) else t, out)
            return loss, (loss.detach(), detached)

        options = {"chunk_size": chunk_size, "randomness": randomness or "error"}
        per_example = vmap(grad(one_example, has_aux=True), (None, None, *dims), **options)
        return per_example(trainable, fixed, x, y)

    return batched


class _ModelAndLoss(nn.Module):
    """The model and its loss as one module: under ``functional_call`` the loss reads the same
    parameters as the model (a weight penalty in the loss is part of each example's gradient)."""

    def __init__(self, model: nn.Module, loss_fn: LossFn) -> None:
        super().__init__()
        self.model, self.loss_fn = model, loss_fn

    def forward(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, Any]:
        out = call_model(self.model, x)
        return self.loss(out, y), out

    def loss(self, out: Any, y: torch.Tensor) -> torch.Tensor:  # a frame of its own
        return self.loss_fn(out, y)


def repeated_module(model: nn.Module) -> str | None:
    """The names of the first module with parameters that sits at two places, as ``"a and b"``."""
    seen: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        if next(module.parameters(recurse=False), None) is None:
            continue
        if (first := seen.setdefault(id(module), name)) != name:
            return f"{first} and {name} ({type(module).__name__})"
    return None


def vmap_failure(model: nn.Module, error: RuntimeError) -> UnsupportedModelError:
    """The refusal of a call that ``torch.func`` could not run, naming the recurrent layers."""
    if "checkpoint" in str(error).lower():
        return UnsupportedModelError(CHECKPOINT_REFUSAL)
    cause = first_line(error)
    setup = "setup_context" in cause
    named = list(model.named_modules())
    hooked = [(n or "<root>", m) for n, m in named if m._backward_hooks or m._backward_pre_hooks]
    if setup and hooked:  # torch's BackwardHookFunction has no setup_context
        name, module = hooked[0]
        kind = "hook" if module._backward_hooks else "pre_hook"
        return UnsupportedModelError(
            f"{name} has a full backward {kind.replace('_', '-')} (register_full_backward_{kind}),"
            f" whose autograd.Function torch.func's vmap cannot run ({cause}); use method=hooks or"
            " loop"
        )
    unbatchable = [f"{n} ({type(m).__name__})" for n, m in named if isinstance(m, VMAP_FAILS)]
    if (in_loss := raised_in(error, _ModelAndLoss.loss)) or not unbatchable:
        where = "loss_fn" if in_loss else "this model"
        return UnsupportedModelError(f"torch.func's vmap failed on {where} ({cause})")
    return UnsupportedModelError(
        f"torch.func's vmap failed at {', '.join(unbatchable)}, which it cannot batch here "
        f"({cause}); method=auto or hooks replays such layers one example at a time"
    )


class FuncPerSample(PerSampleGradients):
    """Per-sample gradients with ``vmap(grad(loss_fn(model(x_i[None]), y_i[None])))``;
    ``chunk_size``: examples per ``vmap`` chunk (``None``: the whole batch); ``compile_mode``:
    ``None`` (eager) or a ``torch.compile`` mode for ``vmap(grad)``."""

    method = "func"

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        chunk_size: int | None = None,
        *,
        randomness: str | None = None,
        compile_mode: str | None = None,
        check_every: int = CHECK_EVERY,
    ) -> None:
        if (repeated := repeated_module(model)) is not None:
            raise UnsupportedModelError(
                f"{repeated}: one module at two places of the model, whose parameters "
                "torch.func.functional_call cannot swap (it would leave a stale weight behind); "
                "use method=hooks (auto does)"
            )
        if chunk_size is not None:  # None: the whole batch at once
            check_int_at_least("pipeline.chunk_size", chunk_size, 1)
        if randomness is not None:  # None: no random layers
            check_choice("randomness", randomness, RANDOMNESS_CHOICES)
        self.chunk_size, self.randomness, self.compile_mode = chunk_size, randomness, compile_mode
        super().__init__(model, loss_fn, check_every)
        self._layout_key, self._layout = None, None  # the output's layout, per kind of batch
        loss = loss_fn if compile_mode is not None else self.extra_loss  # vmap: extra calls
        grad_fn = _make_grad_fn(model, loss, chunk_size, randomness)
        self._grad_fn = grad_fn if compile_mode is None else compile_step(grad_fn, compile_mode)

    def restructure(self) -> None:
        super().restructure()
        if wrapped := [n or "<root>" for n, m in self.model.named_modules() if compiled(m)]:
            raise UnsupportedModelError(
                f"{wrapped[0]} is a torch.compile'd module, which torch.func's vmap cannot run; "
                "use method=loop (auto takes it), or compile the whole step (trainer.compile)"
            )

    def check(self) -> None:
        if autocast_on():
            raise UnsupportedModelError(
                "method=func under torch.autocast: torch.func's vmap does not run every layer in "
                "its autocast dtype; use method=hooks or loop (auto takes them)"
            )
        super().check()

    def _compute(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """The rows from ``vmap(grad)``; ``param.grad`` from the batch's own ``loss.backward()``."""
        batch, key = batch_size(x), (input_shapes(x), self.state.key())
        layout = self._output_layout(key, x)
        due = self.checker.due(key, batch)
        trainable, fixed = split_state(self.model)
        start = generator_states()
        try:
            grads, (losses, out) = self._grad_fn(trainable, fixed, x, y)  # {name: (B, ...)}
        except RuntimeError as error:
            raise vmap_failure(self.model, error) from error
        grads = {n: g.detach() for n, g in grads.items()}  # an input's history (x.requires_grad_())
        moved = self._found.moved()  # by the examples' forward: a step count, an activation
        self._found()  # the batch's own forward below runs on the attributes the call found
        rows = as_batch_grads(grads)
        # torch's (F.dropout, randn_like too); numpy's or Python's, one draw for all examples
        drew, elsewhere = (False, False) if in_graph_safe() else draws_since(start)
        if self.randomness is not None and (drew or random_modules(self.model)):
            if elsewhere:  # no batch step would compare the rows with the batch's draws
                raise UnsupportedModelError(
                    f"{DRAWN_ELSEWHERE}, and beside its random layers no batch step checks the "
                    f"rows; {HOOKS_DRAW}"
                )
            result = self._drawn(x, y, rows, grads, losses, out, layout, key, due, batch)
            if moved:  # no batch forward ran: one, for the attributes a plain step leaves
                with torch.no_grad(), forked_generators():
                    call_model(self.model, x)
            return result
        if elsewhere:  # the batch's forward draws as a plain step's
            set_generator_states(start)
        try:
            return self._batch_step(x, y, rows, losses, out, layout, key, due)
        except UnsupportedModelError as error:  # the draws are the likelier cause
            plain = type(error) is UnsupportedModelError and "draws random" not in str(error)
            if elsewhere and plain:
                seen = str(error).split("; use method=")[0]  # its advice: loop refuses draws
                raise UnsupportedModelError(f"{DRAWN_ELSEWHERE} ({seen}); {HOOKS_DRAW}") from error
            raise

    def _batch_step(self, x, y, rows, losses, out, layout, key, due):
        """``param.grad`` from the batch's own forward and ``loss.backward()``; the rows checked
        against it."""
        batch, params = batch_size(x), self.state.trainable()
        with GradSnapshot(params.values()) as snapshot, torch.enable_grad():
            batch_out = call_model(self.model, x)  # the batch's own forward
            layout.check_batch(batch_out, batch)
            loss = loss_of(self.loss_fn, batch_out, y)
            if loss.requires_grad:
                loss.backward(retain_graph=due)
            if not due:  # a full check reads every example's loss
                self._settle_split(out, y, layout, losses, batch)
            full = partial(self.full_check, x, y, batch_out, layout, rows=rows, params=params)
            identity = partial(identity_problem, self.model, params, rows, method=self.method)
            self.verify_and_check((x, y), rows, params, snapshot, full if due else None, identity)
            if due:
                self.checker.passed(key, batch)
        return loss.detach(), rows

    def _drawn(self, x, y, rows, grads, losses, out, layout, key, due, batch):
        """Random layers active: no batch backward reproduces the examples' own masks, so
        ``param.grad`` is the rows' mean (a gradient hook, which that ignores, is refused)."""
        refuse_gradient_hooks(
            self.state.trainable(),
            "and with random layers active method=func forms param.grad from the rows, which the "
            "hook cannot act on; put the random layers in eval mode, or remove the hook",
        )
        if due:
            with kept_state(self.model), torch.enable_grad():  # the batch's own forward
                self.full_check(x, y, call_model(self.model, x), layout, None)
            self.checker.passed(key, batch)
        else:
            self._settle_split(out, y, layout, losses, batch)
        if self.extra_loss.stateful:  # no batch loss ran: one, for the state a plain step leaves
            with torch.no_grad():
                self.loss_fn(_batched(out, layout), y)
        self.refuse_changed(read=due)  # before param.grad is written
        for name, p in self.state.named:
            if (g := grads.get(name)) is not None:
                mean = g.mean(dim=0).to(p.dtype)  # (*param.shape)
                p.grad = mean if p.grad is None else p.grad.add_(mean)
        return losses.mean(), rows

    def _settle_split(self, out: Any, y: torch.Tensor, layout: OutputLayout, losses, batch: int):
        """``loss_fn`` of the examples' own outputs, stacked as a batch's, against their mean."""
        loss = loss_of(self.extra_loss, _batched(out, layout), y).detach()
        if self.checker.split(batch) is not None:
            gap = relative_gap(loss, losses.mean(), losses.abs().mean())
            self.checker.settle_gap(gap, losses.dtype)

    def _output_layout(self, key: tuple, x: Inputs) -> OutputLayout:
        if self._layout_key != key:
            found = {n for n, _ in self.model.named_buffers()}
            with kept_state(self.model) as changed, torch.no_grad():
                two, three = (call_model(self.model, take(x, [0] * k)) for k in (2, 3))
                updated = changed()
                buffers = dict(self.model.named_buffers())  # with one the forward made
            if updated:
                kind = "buffer" if updated[0] in buffers else "parameter"
                hooks = not any(map(parametrize.is_parametrized, self.model.modules()))
                how = (
                    "sets it (registered as None, or in forward; run one plain forward before "
                    "make_per_sample)"
                    if kind == "buffer" and updated[0] not in found
                    else "changes it in place (running statistics, a counter, a momentum "
                    "encoder, spectral_norm's vector)"
                )
                raise UnsupportedModelError(
                    f"{kind} {updated[0]}: the model's forward {how}, and torch.func's functional "
                    "call cannot carry the change out; use method="
                    f"{'hooks or loop (auto takes them)' if hooks else 'loop (auto takes it)'}"
                )
            self._layout, self._layout_key = OutputLayout.probed(two, three), key
        return self._layout


def _batched(out: Any, layout: OutputLayout) -> Any:
    """The batch's output from ``vmap``'s stack of the examples' own (``(B, *shape)`` leaves,
    each with the example's batch dimension of size 1 at its place)."""
    leaves, spec = tree_flatten(out)
    merged = []
    for t, d in zip(leaves, layout.dims, strict=True):
        if not isinstance(t, torch.Tensor):
            merged.append(t)
        elif d is None:  # as the batch's if it is the examples' mean (a term of the parameters
            merged.append(t.mean(0) if t.is_floating_point() else t[0])  # alone: the same)
        elif t.dim() > d + 1 and t.shape[d + 1] == 1:
            merged.append(t.squeeze(d + 1).movedim(0, d))
        else:  # an example's output without the batch dimension (squeezed): stacked as is
            merged.append(t.movedim(0, d))
    return tree_unflatten(merged, spec)
