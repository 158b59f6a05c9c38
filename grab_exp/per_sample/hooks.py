"""``method=hooks`` / ``factored``: per-sample gradients from one backward pass, one step
(:meth:`HookedPerSample._compute`) over the parts :mod:`grab_exp.per_sample` lists. Each part
refuses, in one line naming the layer, what it cannot get right."""

from __future__ import annotations

import contextlib
import weakref
from functools import partial
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.base import LossFn, PerSampleGradients
from grab_exp.per_sample.check.examples import mismatch
from grab_exp.per_sample.check.loss import (
    OutputSplit,
    forwards_gap,
    known_mean,
    loss_of,
    output_rounding,
)
from grab_exp.per_sample.check.mean import GradSnapshot
from grab_exp.per_sample.check.resampled import counted_problem
from grab_exp.per_sample.check.rounding import gradients
from grab_exp.per_sample.check.schedule import CHECK_EVERY
from grab_exp.per_sample.check.state import drew_since, generator_states, kept_state
from grab_exp.per_sample.check.tolerance import OUTPUT_TOLERANCE
from grab_exp.per_sample.layout import Call, Inputs, batch_size, call_model
from grab_exp.per_sample.modules import UnsupportedModelError, compiled, draws_random, label
from grab_exp.per_sample.plan import Layers, Planner
from grab_exp.per_sample.recording import (
    REINDEXED,
    Recorder,
    forward_replaced,
    operations,
    refuse_foreign_hooks,
    refuse_whole_only,
    reindexes,
)
from grab_exp.per_sample.rows import GradBuffer, Rows

__all__ = ["FactoredPerSample", "HookedPerSample", "UnsupportedModelError", "check_supported"]


def check_supported(model: nn.Module, ties: bool = True) -> None:
    """Refuse the first parameter shared by two modules (with ``ties``; tied after construction,
    both layers' rows add up), parametrized layer or scripted module (one module at two places
    is fine: its calls are summed)."""
    owners: dict[int, tuple[int, str]] = {}  # parameter -> (its module, that module's name)
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, torch.jit.ScriptModule):
            raise UnsupportedModelError(
                f"{label(name, module)} is a torch.jit.script module, whose layers the hook "
                "path cannot hook; use method=func (auto does)"
            )
        if compiled(module):
            raise UnsupportedModelError(
                f"{label(name, module)} is a torch.compile'd module, whose layers run inside a "
                "compiled graph that the hook path's hooks cannot follow; use method=loop, or "
                "compile the whole step (trainer.compile)"
            )
        if parametrize.is_parametrized(module):
            raise UnsupportedModelError(
                f"{label(name, module)} is parametrized (torch.nn.utils.parametrize: "
                "weight_norm, spectral_norm, orthogonal, ...): the hook path cannot compute its "
                "per-sample gradients; use method=func"
            )
        if isinstance(module, nn.EmbeddingBag) and module.sparse:
            raise UnsupportedModelError(
                f"{label(name, module)} with sparse=True: the hook path's replay of it cannot "
                "take its sparse gradient; use method=loop (auto takes it), or sparse=False"
            )
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        firsts = [owners.setdefault(id(p), (id(module), name)) for p in own]  # their first owners
        if ties and (tied := [n for owner, n in firsts if owner != id(module)]):
            raise UnsupportedModelError(
                f"{name or '<root>'} (shares a parameter with {tied[0]}): the hook path cannot "
                "compute its per-sample gradients; use method=func"
            )


class HookedPerSample(PerSampleGradients):
    """``method=hooks`` on a model that passes :func:`check_supported`; ``reuse_buffer``: every
    call's rows in one reused ``(B, d)`` ``grad_buffer``, which ``Ordering.step`` takes without a
    copy: **the next call overwrites them**. ``registry``, ``planner``, ``recorder``, ``rows``:
    the step's parts, built anew when the trainable set or the modules change."""

    method = "hooks"
    factored = False  # rules return factors where they pay (FactoredPerSample)
    module_dropout = one_backward = True
    registry: Layers | None = None  # None until the hooks are set

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        *,
        reuse_buffer: bool = False,
        check_every: int = CHECK_EVERY,
    ) -> None:
        super().__init__(model, loss_fn, check_every)
        check_supported(model)
        self.reuse_buffer, self.grad_buffer = reuse_buffer and not self.factored, GradBuffer()
        self._build_layers()

    def restructure(self) -> None:
        super().restructure()
        if self.registry is not None:  # not while the base class is being built
            check_supported(self.model, ties=False)  # a parametrization or scripted module since
            self._build_layers()

    def _build_layers(self) -> None:
        """Hook the layers (again when the trainable set or a forward changed); no probe kept.
        The hooks go when this object does (an epoch's new ``make_per_sample`` stacked them)."""
        self.remove()
        self.registry = Layers()
        weakref.finalize(self, self.registry.remove)
        self.recorder = Recorder(self.registry)
        self.planner = Planner(self.model, self.registry, self.recorder)
        buffer = self.grad_buffer if self.reuse_buffer else None
        self.rows = Rows(self.planner, self.factored, buffer)
        self._trainable = self.state.key()[0]
        self.checker.forget()

    def remove(self) -> None:
        """Remove every hook from the model (this object is unusable afterwards)."""
        if self.registry is not None:
            self.registry.remove()

    def state_bytes(self) -> int:
        buffer = self.grad_buffer.buffer
        return 0 if buffer is None else buffer.numel() * buffer.element_size()

    def quiet(self) -> contextlib.AbstractContextManager:
        return self.recorder.in_mode("idle")

    @torch.enable_grad()
    def _compute(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        batch, modes = batch_size(x), self.state.key()
        if self._trainable != modes[0] or forward_replaced(self.registry):
            self._build_layers()  # a layer was frozen or unfrozen, or its forward replaced
        refuse_foreign_hooks(self.registry)
        shapes = self.planner.use_plan(x, modes)
        plan, recorder = self.planner.plan, self.recorder
        recorder.calls, recorder.batch = {}, batch
        with recorder.in_mode("record"):
            out = call_model(self.model, x)
        plan.output.check_batch(out, batch)
        loss = loss_of(self.loss_fn, out, y)
        calls, recorder.calls = recorder.calls, {}
        self.planner.check_calls(calls)
        changed = recorder.read_in_place(calls)
        counts = tuple(len(calls.get(n, ())) for n in self.registry.modules)
        graph = operations(loss) if self.checker.on else None  # a walk only a check reads
        if self.checker.on and plan.output.unbatched(out):  # a value of the batch: read alone?
            refuse_whole_only(loss, out, plan.output.dims)
        key = (shapes, modes, counts, changed, graph)  # an in-place output: a new kind
        later, split = False, None
        due = self.checker.due(key, batch) or (plan.reindexes and self.checker.on)
        if due:
            recorder.refuse_direct_uses(loss, calls)
            plan.reindexes |= reindexes(calls, out, batch)
        elif (k := self.checker.split(batch)) is not None:  # a full check reads every loss
            later = plan.output.unbatched(out)  # a value of the batch: parts forwarded, later
            known = later or known_mean(self.loss_fn, out, y, plan.output)  # nothing to find
            split = None if known else OutputSplit(self.extra_loss, out, y, plan.output, k)
        params = self.state.trainable()  # read once per call: the rows' columns
        with GradSnapshot(params.values()) as snapshot:  # a refusal puts param.grad back
            recorder.backward(loss, calls, retain=due)  # loss.backward(): autograd's param.grad
            if split is not None:  # the hook on the output read the batch's gradient there
                self.checker.settle_gap(split.gap(loss), split.dtype)
            with torch.autocast(loss.device.type, enabled=False):  # rows in the weights' dtype
                rows = self.rows.form(calls, batch, params)
            grads = self.rows.batch_grads(rows, params)
            if later:
                self._split_forwarded(x, y, loss, k, grads, params)
            full = partial(self.full_check, x, y, out, plan.output, rows=grads, params=params)
            rounding = partial(output_rounding, self.extra_loss, out, y, plan.output)
            identity = self._identity(calls, rows, batch, rounding) if due else None
            self._verify((x, y), grads, params, snapshot, calls, full if due else None, identity)
            if due:
                self.checker.passed(key, batch)
        return loss.detach(), grads

    def _split_forwarded(self, x, y, loss, k: int, grads: BatchGrads, params) -> None:
        """The loss split of an output with a value of the whole batch (HuggingFace's ``loss``
        from ``labels`` in the inputs, which every slice of the output repeats): the rows of the
        first ``k`` examples against a forward and backward of theirs; where modules draw random
        numbers (masks no forward repeats), the losses' values in eval mode; nothing where the
        forward drew otherwise (noise)."""
        with kept_state(self.model), self.quiet():  # each forward on the attributes found
            forward = lambda inputs: self._found() or call_model(self.model, inputs)  # noqa: E731
            if any(map(draws_random, self.model.modules())):
                gap = forwards_gap(forward, self.extra_loss, x, y, loss, k, self.model)
                return self.checker.settle_gap(gap, loss.dtype)
            start, counts = generator_states(), torch.arange(batch_size(y)) < k  # (B,)
            problem = counted_problem(
                forward, self.extra_loss, x, y, grads, params, counts, list(range(k))
            )
            if problem is not None and not drew_since(start):
                raise UnsupportedModelError(problem)

    def _verify(self, batch, grads, params, snapshot, calls, full, identity) -> None:
        """:meth:`verify_and_check`, naming a layer autograd did not record as the cause."""
        try:
            self.verify_and_check(batch, grads, params, snapshot, full, identity, self.rows.sums)
        except UnsupportedModelError as error:
            blind = [n for n, cs in calls.items() if any(not any(c.edges) for c in cs)]
            if not blind and not self.planner.plan.reindexes:
                raise
            cause = REINDEXED if not blind else (
                f"{self.registry.label(blind[0])} ran without autograd recording it (under "
                "torch.no_grad(), or in a torch.utils.checkpoint with use_reentrant=True, which "
                "runs it again inside the backward, out of the hook path's sight)"
            )  # fmt: skip
            raise UnsupportedModelError(f"{error} ({cause})") from None

    def _identity(self, calls: dict[str, list[Call]], rows: dict[str, Any], batch: int, rounding):
        """The identity (:mod:`~grab_exp.per_sample.check`) at the rule layers' outputs and the
        other layers' parameters, and at those of a rule layer whose output changed in place
        since (a ReLU(inplace=True): by now another tensor). At the outputs, each example's own
        gradient is compared, which near the loss's optimum cancels to the loss's ``rounding()``
        (:func:`.check.loss.output_rounding`); at the parameters, sums over the examples."""
        in_place = {name for name, cs in calls.items() if any(c.in_place for c in cs)}
        rule_outputs = self.registry.rules.keys() - in_place
        at_params = [name for name in self.registry.modules if name not in rule_outputs]
        outputs = [
            (name, call.outputs[k], g, layout.outputs[k])
            for name in self.registry.rules
            if name not in at_params and name in calls
            for call, layout in self.planner.call_layouts(name, calls[name])
            for k, g in enumerate(call.grads)
            if g is not None
        ]
        names = {id(p): n for n, p in self.state.named}  # a tied one: the rows' (first) name
        params = [
            (name, names[id(p)], p)
            for name in at_params
            for p in self.registry.own[name].values()
            if p.requires_grad
        ]

        def identity(losses: torch.Tensor, c: torch.Tensor) -> str | None:
            inputs = [t for _, t, _, _ in outputs] + [p for _, _, p in params]
            want = gradients(losses.mul(c).sum(), inputs)
            at_outputs, at_params = want[: len(outputs)], want[len(outputs) :]
            weighted_outputs = (  # c along each output gradient's batch dimension
                (name, "its output gradients", g * c.view(-1, *[1] * (g.dim() - d - 1)) * batch, w)
                for (name, _, g, d), w in zip(outputs, at_outputs, strict=True)
            )
            weighted_rows = (
                (name, f"the rows of {n}", torch.tensordot(c, rows[n].to(c.dtype), dims=1), w)
                for (name, n, _), w in zip(params, at_params, strict=True)
            )
            problem = mismatch(
                self.model, weighted_outputs, self.method, OUTPUT_TOLERANCE, rounding
            )
            return problem or mismatch(self.model, weighted_rows, self.method)

        return identity


class FactoredPerSample(HookedPerSample):
    """``method=factored``: layers whose rule has a factor form that pays keep it
    (:class:`~grab_exp.grads.linear.LinearFactors`); no buffer is reused."""

    method = "factored"
    factored = True
