"""Per-sample gradients from one backward pass, with per-layer hooks.

Forward hooks keep every trainable layer's inputs and outputs; one backward pass
(``torch.autograd.grad`` of the loss at the trainable parameters) gives ``param.grad`` exactly as
``loss.backward()`` would, and the same backward gives the gradients at the layers' outputs. Each
layer's per-sample gradients come from its inputs and output gradients:

* a layer with a rule (:mod:`grab_exp.per_sample.rules`: Linear, Conv2d, Embedding, LayerNorm)
  uses its closed form;
* any other layer with trainable parameters of its own (GroupNorm, grouped Conv2d,
  RNN/LSTM/GRU, MultiheadAttention, BatchNorm in eval mode, a custom module with an
  ``nn.Parameter``) gets the per-layer fallback (:mod:`grab_exp.per_sample.fallback`): only that
  layer is re-run, the rest of the model keeps its rules.

Each new kind of batch (its input shapes) is probed first, on copies of its first example: where
each layer's tensors carry the batch (:mod:`grab_exp.per_sample.layout`; rules and fallbacks read
the batch from that dimension), a layer whose input has no batch dimension (a position embedding)
gets its input expanded over the batch, a layer called several times sums its calls, a submodule
whose parameters its parent uses without calling it (``MultiheadAttention.out_proj``) is
differentiated with the parent, and one whose parameters nothing uses (an unused head) is idle.
The rows are checked (:mod:`grab_exp.per_sample.check`) before
``param.grad`` is written. Dropout modules in training mode are right as they are: a layer's
saved input carries the masks the batch forward drew.

Refused (``UnsupportedModelError``, one line naming the layer; ``method=func`` may cover them): a
parameter shared by two modules (tied weights), a parametrized layer, a layer whose replay would
draw random numbers (attention or RNN dropout in training mode), a replayed layer whose input
is changed in place during or after its call, a layer that runs for some examples only, a
parameter that the loss reaches other than through its layer (a weight penalty in the loss),
and whatever the check finds.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from torch.autograd.graph import GradientEdge, get_gradient_edge
from torch.nn.modules.module import _global_forward_hooks
from torch.nn.utils import parametrize
from torch.utils._pytree import tree_flatten, tree_unflatten

from grab_exp.grads import BatchGrads, as_batch_grads
from grab_exp.per_sample.base import LossFn, PerSampleGradients, one_line
from grab_exp.per_sample.buffer import GradBuffer
from grab_exp.per_sample.check.examples import mismatch
from grab_exp.per_sample.check.loss import loss_gap, loss_of
from grab_exp.per_sample.check.mean import GradSnapshot
from grab_exp.per_sample.check.schedule import CHECK_EVERY
from grab_exp.per_sample.check.state import kept_state
from grab_exp.per_sample.check.tolerance import OUTPUT_TOLERANCE
from grab_exp.per_sample.fallback import FuncFallback
from grab_exp.per_sample.layout import (
    Call,
    CallLayout,
    Inputs,
    OutputLayout,
    batch_size,
    call_model,
    expand_over_batch,
    input_shapes,
    shape_of,
    take,
)
from grab_exp.per_sample.modules import CHECKPOINT_REFUSAL, UnsupportedModelError, draws_random
from grab_exp.per_sample.rules import LayerRule, rule_for
from grab_exp.per_sample.rules.base import OURS, is_ours

Grads = dict[str, torch.Tensor]

__all__ = ["FactoredPerSample", "HookedPerSample", "UnsupportedModelError", "check_supported"]


def check_supported(model: nn.Module) -> None:
    """Raise ``UnsupportedModelError`` naming the first parameter shared by two modules (tied
    weights: a layer's hooks see only that layer's use of it), or the first parametrized layer
    (``torch.nn.utils.parametrize``: its weight is computed outside its forward), or the first
    ``torch.jit.script`` module (it takes no Python hooks). One module
    at two places (called twice) is fine: its calls are summed."""
    owners: dict[int, tuple[int, str]] = {}  # parameter -> (its module, that module's name)
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, torch.jit.ScriptModule):
            raise UnsupportedModelError(
                f"{_label(name, module)} is a torch.jit.script module, whose layers the hook "
                "path cannot hook; use method=func (auto does)"
            )
        if parametrize.is_parametrized(module):
            raise UnsupportedModelError(
                f"{_label(name, module)} is parametrized (torch.nn.utils.parametrize: "
                "weight_norm, spectral_norm, orthogonal, ...): the hook path cannot compute its "
                "per-sample gradients; use method=func"
            )
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        tied = [
            owners[id(p)][1]
            for p in own
            if owners.setdefault(id(p), (id(module), name))[0] != id(module)
        ]
        if tied:
            raise UnsupportedModelError(
                f"{name or '<root>'} (shares a parameter with {tied[0]}): the hook path cannot "
                "compute its per-sample gradients; use method=func"
            )


def _label(name: str, module: nn.Module) -> str:
    return f"{name or '<root>'} ({type(module).__name__})"


@dataclass
class Plan:
    """What the probe of one kind of batch found (one per :func:`~.layout.input_shapes`).

    Attributes:
        layouts: layer name -> the :class:`~grab_exp.per_sample.layout.CallLayout` of each of its
            calls in one forward (a layer whose calls share one layout may run any number of
            times).
        expanded: names of the layers whose input is expanded over the batch.
        output: where the model's output has the batch.
    """

    layouts: dict[str, list[CallLayout]]
    expanded: set[str]
    output: OutputLayout


class HookedPerSample(PerSampleGradients):
    """``method=hooks``: per-sample gradients from one backward pass; per-layer rules, else the
    per-layer fallback.

    Args:
        model: a model that passes :func:`check_supported`.
        loss_fn: ``loss_fn(logits, y)`` returning the batch MEAN of per-example losses (the
            default reduction of torch's losses).
        reuse_buffer: write the per-sample gradients of every call into one reused
            ``(B, d)`` buffer (row-major, columns in ``named_parameters`` order); the returned
            gradients are that buffer, so **the next call overwrites them**: consume (or clone)
            them before calling again. ``Ordering.step`` then takes the buffer as its ``(B, d)``
            matrix without a copy, and no step allocates gradient-sized tensors.
        check_every: see :class:`~grab_exp.per_sample.base.PerSampleGradients`.

    Attributes:
        rules: layer name -> its :class:`~grab_exp.per_sample.rules.LayerRule`.
        fallbacks: layer name -> its :class:`~grab_exp.per_sample.fallback.FuncFallback` (the
            layers without a rule, and those that adopted a submodule's parameters).
        idle: layers that did not run in the probe and whose parameters its output does not use
            (an unused head): their rows are zero while they do not run.
        plan: the probe's :class:`Plan` for the current kind of batch (``layouts``,
            ``expanded`` and ``output`` are its fields).
        grad_buffer: the reused buffer (its ``buffer`` ``(rows >= B, d)`` once a call made it).
    """

    method = "hooks"
    factored = False  # rules return factors where they pay (FactoredPerSample)
    module_dropout = True
    _handles: dict[str, list[Any]] | None = None  # None until the hooks are set

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
        self.reuse_buffer = reuse_buffer and not self.factored
        self.grad_buffer = GradBuffer()
        self._modules = dict(model.named_modules())
        self._handles = {}
        self._mode = "idle"  # record (this path's forward) | probe | idle (any other forward)
        self._batch = 0
        self._calls: dict[str, list[Call]] = {}
        self._entry_versions: dict[str, list[list]] = {}  # replayed layer -> its open calls'
        self._build_layers()

    # ------------------------------------------------------------------ layers and hooks

    def restructure(self) -> None:
        super().restructure()
        if self._handles is not None:  # not while the base class is being built
            self._modules = dict(self.model.named_modules())
            self._build_layers()

    def _build_layers(self) -> None:
        """Hook every layer with trainable parameters of its own (again, when the trainable set
        changed), and forget the probes."""
        self.remove()
        self._layers: dict[str, nn.Module] = {}
        self._own: dict[str, dict[str, nn.Parameter]] = {}  # layer -> name -> its parameter
        self.rules: dict[str, LayerRule] = {}
        self.fallbacks: dict[str, FuncFallback] = {}
        self.idle: set[str] = set()
        self._plans: dict[tuple, Plan] = {}
        self.plan: Plan | None = None
        self._trainable = self.state.key()[0]
        for name, m in self.model.named_modules():
            if any(p.requires_grad for p in m.parameters(recurse=False)):
                self._add_layer(name, m)
        self.checker.forget()

    def _add_layer(self, name: str, layer: nn.Module, adopted: tuple[str, ...] = ()) -> None:
        rule = None if adopted else rule_for(layer)
        if rule is not None:
            self.rules[name] = rule
        else:
            self.fallbacks[name] = FuncFallback(layer, adopted)
        self._layers[name] = layer
        prefix = f"{name}." if name else ""
        own = [n for n, _ in layer.named_parameters(recurse=False)] + list(adopted)
        self._own[name] = {prefix + n: layer.get_parameter(n) for n in own}
        self._handles[name] = [
            layer.register_forward_hook(self._forward_hook(name), with_kwargs=True),
            layer.register_forward_pre_hook(self._pre_hook(name), with_kwargs=True),
        ]

    def remove(self) -> None:
        """Remove every hook from the model (this object is unusable afterwards)."""
        for handles in self._handles.values():
            for handle in handles:
                handle.remove()
        self._handles.clear()

    @property
    def layouts(self) -> dict[str, list[CallLayout]]:
        """The current plan's layouts (``{}`` before the first call)."""
        return {} if self.plan is None else self.plan.layouts

    @property
    def expanded(self) -> set[str]:
        """The current plan's expanded layers."""
        return set() if self.plan is None else self.plan.expanded

    def state_bytes(self) -> int:
        buffer = self.grad_buffer.buffer
        return 0 if buffer is None else buffer.numel() * buffer.element_size()

    def quiet(self) -> contextlib.AbstractContextManager:
        """Hooks idle: the model runs as a plain model (no expansion, nothing recorded)."""
        return self._in_mode("idle")

    @contextlib.contextmanager
    def _in_mode(self, mode: str) -> Iterator[None]:
        """The hooks in ``mode`` inside the block: ``idle``, or this path's own forwards
        (``probe``, ``record``)."""
        before, self._mode = self._mode, mode
        try:
            yield
        finally:
            self._mode = before

    def _pre_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> Any:
            if self._mode == "idle":
                return None
            changed = name in self._expanding
            if changed:
                args = expand_over_batch(args, self._batch)
            if self._mode == "record" and name in self.fallbacks:  # its replay reads its inputs
                versions = [_version(t) for t in tree_flatten((list(args), kwargs))[0]]
                self._entry_versions.setdefault(name, []).append(versions)
            return (args, kwargs) if changed else None

        setattr(hook, OURS, True)
        return hook

    def _forward_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> Any:
            if self._mode == "idle":
                return None
            if not kwargs and isinstance(output, torch.Tensor) and _all_tensors(args):
                leaves, spec = list(args), _args_spec(len(args))  # the usual call: no pytree
                outputs, output_spec = [output], None
            else:
                leaves, spec = tree_flatten((list(args), kwargs))
                outputs, output_spec = tree_flatten(output)
            sources = [t.grad_fn for t in leaves if isinstance(t, torch.Tensor) and t.grad_fn]
            leaves = [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves]
            graded = [isinstance(t, torch.Tensor) and t.requires_grad for t in outputs]
            # an output may be computed from another one inside the layer (h, then z = f(h)):
            # views of them take only the gradients from outside, so no path counts twice
            alias = self._mode == "record" and name in self.fallbacks and sum(graded) > 1
            if alias:
                outputs = [t.view_as(t) if g else t for t, g in zip(outputs, graded, strict=True)]
            call = Call(leaves, spec, outputs, [None] * len(outputs), sources)
            call.versions = [t._version if isinstance(t, torch.Tensor) else 0 for t in outputs]
            if self._mode == "record":
                call.edges = [_edge(t) if g else None for t, g in zip(outputs, graded, strict=True)]
                if name in self.fallbacks:
                    call.input_versions = self._entry_versions[name].pop()
            self._calls.setdefault(name, []).append(call)
            return tree_unflatten(outputs, output_spec) if alias else None

        setattr(hook, OURS, True)
        return hook

    @property
    def _expanding(self) -> set[str]:
        return self._probe_expanded if self._mode == "probe" else self.expanded

    # ------------------------------------------------------------------ the probe

    def _use_plan(self, x: Inputs) -> tuple:
        """Select (probing it if new) the plan of ``x``'s kind of batch; return its key."""
        key = input_shapes(x)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = self._prepare(x)
        self.plan = plan
        return key

    def _prepare(self, x: Inputs) -> Plan:
        """Probe the layouts on copies of ``x``'s first example; settle adoptions and expansions.

        Each round probes the model; a layer that did not run gives its parameters to its parent
        module (or, if the output does not use them, becomes idle), a layer whose input has no
        batch dimension gets it expanded, and the model is probed again, until nothing changes.
        """
        self._probe_expanded: set[str] = set()
        for _ in range(2 * len(self._modules) + 1):
            two, three, outputs, used = self._probes(x)
            silent = [n for n in self._layers if n not in two and n not in self.idle]
            if silent:
                self.idle.update(n for n in silent if n not in used)
                adopted = [n for n in silent if n in used]
                if adopted:
                    self._adopt(adopted[0])
                continue
            running = [n for n in self._layers if n not in self.idle]
            layouts = {name: self._layouts(name, two, three) for name in running}
            unbatched = {n for n, calls in layouts.items() if any(not c.batched for c in calls)}
            if unbatched <= self._probe_expanded:
                try:
                    output = OutputLayout.probed(*outputs)
                except ValueError as error:
                    message = f"the model's output {error}; use method=func"
                    raise UnsupportedModelError(message) from None
                return Plan(layouts, set(self._probe_expanded), output)
            self._probe_expanded |= unbatched
        raise AssertionError("unreachable: every round adopts or expands one more layer")

    def _probes(self, x: Inputs) -> tuple[dict, dict, tuple, set[str]]:
        """:meth:`_probe` with 2 and with 3 copies of ``x``'s first example (nothing of them
        stays); also the layers that did not run but whose parameters the output uses. A forward
        that the expansion of unbatched inputs breaks is refused by the expanded layers' names."""
        with kept_state(self.model):
            try:
                (two, out2), (three, out3) = self._probe(x, 2), self._probe(x, 3)
            except RuntimeError as error:
                if not self._probe_expanded:
                    raise
                layers = ", ".join(_label(n, self._layers[n]) for n in sorted(self._probe_expanded))
                cause = str(error).strip().splitlines()[0]
                raise UnsupportedModelError(
                    f"{layers}: its input has no batch dimension, and with that input expanded "
                    f"over the batch the model's forward fails ({cause}); use method=func"
                ) from error
            silent = [n for n in self._layers if n not in two and n not in self.idle]
            used = self._used(silent, out2) if silent else set()
        return two, three, (out2, out3), used

    def _probe(self, x: Inputs, copies: int) -> tuple[dict[str, list[tuple]], Any]:
        """Every hooked call's ``(input shapes, output shapes)`` in one forward of ``copies``
        copies of the first example, and the model's output."""
        self._calls, self._batch = {}, copies
        with self._in_mode("probe"), torch.enable_grad():  # as in training (no inference paths)
            out = call_model(self.model, take(x, [0] * copies))
        calls, self._calls = self._calls, {}
        shapes = {
            n: [(shape_of(c.leaves), shape_of(c.outputs)) for c in cs] for n, cs in calls.items()
        }
        return shapes, out

    def _used(self, silent: list[str], out: Any) -> set[str]:
        """The layers among ``silent`` whose parameters ``out`` depends on."""
        leaves = tree_flatten(out)[0]
        leaves = [t for t in leaves if isinstance(t, torch.Tensor) and t.requires_grad]
        params = [(n, p) for n in silent for p in self._own[n].values()]
        if not leaves or not params:
            return set()
        total = sum(t.float().sum() for t in leaves)
        grads = torch.autograd.grad(total, [p for _, p in params], allow_unused=True)
        return {n for (n, _), g in zip(params, grads, strict=True) if g is not None}

    def _layouts(self, name: str, two: dict, three: dict) -> list[CallLayout]:
        layer = self._layers[name]
        if len(two[name]) != len(three.get(name, [])):
            raise UnsupportedModelError(
                f"{_label(name, layer)} runs a different number of times for two examples and for "
                "three; use method=func"
            )
        try:
            return [CallLayout.probed(a, b) for a, b in zip(two[name], three[name], strict=True)]
        except ValueError as error:
            raise UnsupportedModelError(f"{_label(name, layer)} {error}; use method=func") from None

    def _adopt(self, name: str) -> None:
        """Differentiate the parameters of ``name``, which never runs on its own, with its parent
        module's replay (the parent's forward uses them: ``MultiheadAttention.out_proj``)."""
        owner = name.rpartition(".")[0]  # "" for a top-level layer: the root
        start = len(owner) + 1 if owner else 0
        adopted = [n[start:] for n in self._own[name]]
        if owner in self._layers:
            previous = self.fallbacks[owner].adopted if owner in self.fallbacks else []
            adopted = [*previous, *adopted]
            self._drop(owner)
        self._drop(name)
        self._add_layer(owner, self._modules[owner], tuple(adopted))

    def _drop(self, name: str) -> None:
        """Forget a layer and remove its hooks."""
        for handle in self._handles.pop(name):
            handle.remove()
        self._layers.pop(name)
        self.rules.pop(name, None)
        self.fallbacks.pop(name, None)
        self._own.pop(name)

    # ------------------------------------------------------------------ a call

    def _compute(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """Forward and backward on ``x (B, ...)``, ``y (B,)`` (with gradients on, as
        ``torch.func.grad`` has them); the check when it is due; ``param.grad`` last."""
        with torch.enable_grad():
            return self._step(x, y)

    def _step(self, x: Inputs, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        batch = batch_size(x)
        modes = self.state.key()
        if self._trainable != modes[0]:
            self._build_layers()  # a layer was frozen or unfrozen since
        self._refuse_foreign_hooks()
        shapes = self._use_plan(x)
        self._calls, self._batch, self._entry_versions = {}, batch, {}
        with self._in_mode("record"):
            out = call_model(self.model, x)
        loss = loss_of(self.loss_fn, out, y)
        calls, self._calls = self._calls, {}
        self._check_calls(calls)
        changed = self._read_in_place(calls)
        counts = tuple(len(calls.get(n, ())) for n in self._layers)
        key = (shapes, modes, counts, changed)  # an output changed in place: a new kind
        due = self.checker.due(key, batch)
        if due:
            self._refuse_direct_uses(loss, calls)
        elif (k := self.checker.split(batch)) is not None:  # a full check reads every loss
            gap = loss_gap(self.loss_fn, out, y, loss, self.plan.output, k)
            self.checker.settle_gap(gap, loss.dtype)  # before the backward: nothing written yet
        params = self.trainable()  # read once per call: the rows' columns
        with GradSnapshot(params.values()) as snapshot:  # a refusal puts param.grad back
            self._backward(loss, calls, retain=due)  # loss.backward(): autograd's param.grad
            rows = self._rows(calls, batch, params)
            grads = self._batch_grads(rows, params)
            full = (
                (lambda ident: self.full_check(x, y, out, self.plan.output, ident)) if due else None
            )
            identity = self._identity(calls, rows, batch) if due else None
            self._verify(grads, params, snapshot, calls, full, identity, loss)
            if due:
                self.checker.passed(key, batch)
        return loss.detach(), grads

    def _verify(self, grads, params, snapshot, calls, full, identity, loss) -> None:
        """:meth:`verify_and_check`, naming a layer that ran without autograd recording it as
        the cause."""
        try:
            self.verify_and_check(grads, params, snapshot, full, identity, loss)
        except UnsupportedModelError:
            blind = [n for n, cs in calls.items() if any(not any(c.edges) for c in cs)]
            if not blind:
                raise
            raise UnsupportedModelError(
                f"{_label(blind[0], self._layers[blind[0]])} ran without autograd recording it "
                "(torch.utils.checkpoint with use_reentrant=True runs it again inside the "
                "backward, out of the hook path's sight): its rows are missing; use "
                "use_reentrant=False, or method=func"
            ) from None

    def _read_in_place(self, calls: dict[str, list[Call]]) -> bool:
        """Note each call's in-place change (once per call); whether any output changed.

        Raises:
            UnsupportedModelError: an output that is a view (a Linear's on ``(B, T, D)`` input)
                was changed in place: autograd then rebases the view, and the node the layer's
                output came from is no longer on the loss's path; or an input of a replayed
                layer was changed in place during or after its call (its replay would read the
                changed input).
        """
        changed = False
        for name, layer_calls in calls.items():
            for call in layer_calls:
                if call.input_versions and call.input_changed():
                    raise UnsupportedModelError(
                        f"{_label(name, self._layers[name])}: an input it read was changed in "
                        "place during or after its call (x.relu_() on a tensor it was given): the "
                        "hook path replays the layer on its inputs as they are now; use "
                        "method=func (auto does), or an out-of-place operation"
                    )
                call.in_place = call.changed()
                if not call.in_place:
                    continue
                changed = True
                views = [t for t in call.outputs if isinstance(t, torch.Tensor) and t._is_view()]
                if views:
                    raise UnsupportedModelError(
                        f"{_label(name, self._layers[name])}: its output of shape "
                        f"{tuple(views[0].shape)}, a view, was changed in place after the layer "
                        "returned it (an in-place activation or residual add): the hook path "
                        "cannot read its gradient there; use method=func (auto does), or an "
                        "out-of-place operation (x = x + h, not x += h)"
                    )
        return changed

    def _refuse_foreign_hooks(self) -> None:
        """Refuse a forward hook that is not the path's own on a hooked layer, or a global one:
        it can change the output the path differentiates at (checked on every call: a hook may
        come after the path was built)."""
        if _global_forward_hooks:
            raise UnsupportedModelError(
                "a global forward hook (register_module_forward_hook) can change any layer's "
                "output, which the hook path cannot follow; use method=func (auto does)"
            )
        for name, layer in self._layers.items():
            hooks = layer._forward_hooks  # one: the path's own (the usual case, read at once)
            if len(hooks) > 1 and any(not is_ours(h) for h in hooks.values()):
                raise UnsupportedModelError(
                    f"{_label(name, layer)}: a forward hook of its own can change its output, "
                    "which the hook path cannot follow; use method=func (auto does)"
                )

    def _rows(self, calls: dict[str, list[Call]], batch: int, params: dict[str, nn.Parameter]):
        """The rows of every trainable parameter (``(B, *shape)`` or factors), in
        ``named_parameters`` order; keyed by the parameter object, so the rows of a parameter
        that two layers share add up."""
        views = self._buffer_views(batch, params, calls)
        rows: dict[int, Any] = {}
        for name in self._layers:
            own = self._own[name]
            out = [None if id(p) in rows else views.get(n) for n, p in own.items()]
            try:
                grads = self._layer_grads(name, calls.get(name, []), batch, out)
            except UnsupportedModelError:
                raise
            except Exception as error:  # a rule's or a replay's, named by its layer
                label = _label(name, self._layers[name])
                raise UnsupportedModelError(f"{label}: {one_line(error)}") from error
            for (n, p), g in zip(own.items(), grads, strict=True):
                rows[id(p)] = g if id(p) not in rows else _added(rows[id(p)], g, n)
        return {n: rows[id(p)] for n, p in params.items()}

    def _refuse_direct_uses(self, loss: torch.Tensor, calls: dict[str, list[Call]]) -> None:
        """Refuse a parameter that ``loss`` reaches other than through its layer's calls (a
        weight penalty or a center loss in the loss, a parent module that reads it): a walk of
        the autograd graph from the loss that steps over every recorded call, from the nodes
        that made its outputs (as returned: an output changed in place since has another node
        now) to its inputs. Structural: a penalty whose weight is 0 for now is found too."""
        skip: dict[Any, list] = {}  # two calls may return one tensor (a layer returns its input)
        for layer_calls in calls.values():
            for call in layer_calls:
                for edge in call.edges:
                    if edge is not None:
                        skip.setdefault(edge.node, []).extend(call.sources)
        reached = _reached_leaves(loss.grad_fn, skip)
        for name, own in self._own.items():
            used = [n for n, p in own.items() if id(p) in reached]
            if used:
                raise UnsupportedModelError(
                    f"{_label(name, self._layers[name])}: the loss reaches {used[0]} other than "
                    "through this layer's forward (a weight penalty or a center loss in loss_fn, "
                    "a parent module that reads it): the hook path cannot split that part of its "
                    "gradient between the examples; use method=func (auto does), or the "
                    "optimizer's weight_decay for a plain penalty"
                )

    def _batch_grads(self, rows: dict[str, Any], params: dict[str, nn.Parameter]) -> BatchGrads:
        if self.factored:
            shapes = {n: p.shape for n, p in params.items()}
            return BatchGrads.from_parts(rows, shapes)
        return as_batch_grads(rows)

    def _identity(self, calls: dict[str, list[Call]], rows: dict[str, Any], batch: int):
        """The identity at the rule layers' outputs and at the other layers' parameters
        (:mod:`~grab_exp.per_sample.check`): ``(losses, c) -> problem or None``."""
        # an output changed in place since (a ReLU(inplace=True)) is another tensor by now:
        # such a layer is compared at its parameters, like the replayed ones
        at_params = {
            name
            for name in self._layers
            if name not in self.rules or any(c.in_place for c in calls.get(name, []))
        }
        outputs = [
            (name, call.outputs[k], call.grads[k], layout.outputs[k])
            for name in self.rules
            if name not in at_params and name in calls
            for call, layout in zip(
                calls.get(name, []), self._call_layouts(name, calls), strict=True
            )
            for k, g in enumerate(call.grads)
            if g is not None
        ]
        params = [
            (name, n, p)
            for name in self._layers
            if name in at_params
            for n, p in self._own[name].items()
            if p.requires_grad
        ]

        def identity(losses: torch.Tensor, c: torch.Tensor) -> str | None:
            inputs = [t for _, t, _, _ in outputs] + [p for _, _, p in params]
            want = torch.autograd.grad(losses.mul(c).sum(), inputs, allow_unused=True)
            want = [
                torch.zeros_like(t) if w is None else w for t, w in zip(inputs, want, strict=True)
            ]

            at_outputs, at_params = want[: len(outputs)], want[len(outputs) :]

            def output_pairs():
                for (name, _, g, dim), w in zip(outputs, at_outputs, strict=True):
                    shape = [1] * g.dim()
                    shape[dim] = batch
                    yield name, "its output gradients", g * c.view(shape) * batch, w

            def param_pairs():
                for (name, n, _), w in zip(params, at_params, strict=True):
                    got = torch.tensordot(c, rows[n], dims=1)  # (*shape)
                    yield name, f"the rows of {n}", got, w

            method = self.method
            return mismatch(
                self.model, at_outputs, output_pairs(), method, OUTPUT_TOLERANCE
            ) or mismatch(self.model, at_params, param_pairs(), method)

        return identity

    def _call_layouts(self, name: str, calls: dict[str, list[Call]]) -> list[CallLayout]:
        """The layout of each of ``name``'s calls in ``calls``."""
        layouts = self.layouts.get(name, [])
        return [layouts[min(k, len(layouts) - 1)] for k in range(len(calls.get(name, [])))]

    def _check_calls(self, calls: dict[str, list[Call]]) -> None:
        """Refuse a layer that ran where the probe did not see it, or a different number of times
        with calls of different layouts, and a replayed layer that would draw random numbers."""
        for name, layer in self._layers.items():
            ran, probed = len(calls.get(name, [])), self.layouts.get(name, [])
            if ran and not probed:
                raise UnsupportedModelError(
                    f"{_label(name, layer)} ran on this batch but not in the probe of its kind "
                    "of batch (it runs on some batches or examples only: data-dependent "
                    "control flow); use method=func"
                )
            if ran and ran != len(probed) and len(set(probed)) > 1:
                raise UnsupportedModelError(
                    f"{_label(name, layer)} ran {ran} times in this forward and {len(probed)} in "
                    "the probe of the batch's first example, with calls of different layouts "
                    "(control flow that depends on the data); use method=func"
                )
            fallback = self.fallbacks.get(name)  # a rule's layer replays nothing
            drawn = [n for n, m in (fallback.random if fallback else ()) if draws_random(m)]
            if ran and drawn:
                where = f" in {drawn[0]}" if drawn[0] else ""
                raise UnsupportedModelError(
                    f"{_label(name, layer)} draws random numbers{where} (dropout in training "
                    "mode) that replaying the layer for its per-sample gradients cannot "
                    "reproduce; set that dropout to 0, or use method=func with "
                    "randomness='different'"
                )

    def _layer_grads(self, name: str, calls: list[Call], batch: int, out: list) -> list:
        """One layer's per-sample grads ``[(B, *p.shape)]`` (or factors), its calls summed;
        zeros where no call reached the loss."""
        total: list | None = None
        for call, layout in zip(calls, self._call_layouts(name, {name: calls}), strict=True):
            if all(g is None for g in call.grads):
                continue  # this call's outputs did not reach the loss
            grads = self._call_grads(name, call, layout, batch, out, len(calls) > 1)
            if total is None:
                total, out = grads, [None] * len(out)
                continue
            total = [t if g is None else t.add_(g) for t, g in zip(total, grads, strict=True)]
        if total is None:  # the layer did not reach the loss
            own = self._own[name].values()
            total = [_zeros(p, batch, o) for p, o in zip(own, out, strict=True)]
        return total

    def _call_grads(
        self, name: str, call: Call, layout: CallLayout, batch: int, out: list, several: bool
    ) -> list:
        layer = self._layers[name]
        for k, g in enumerate(call.grads):
            if g is not None and layout.outputs[k] is None:
                raise UnsupportedModelError(
                    f"{_label(name, layer)} returns a tensor of shape {tuple(g.shape)} without a "
                    "batch dimension although its input has one: it mixes the examples of a "
                    "batch; use method=func"
                )
        rule = self.rules.get(name)
        if rule is not None:
            a = call.leaves[0].movedim(layout.inputs[0], 0)  # (B, ...)
            g_sum = call.grads[0].movedim(layout.outputs[0], 0) * batch  # (B, ...), summed loss
            factored = self.factored and not several and not call.in_place
            factors = rule.factors(layer, a, g_sum) if factored else None
            return factors or rule.per_sample(layer, a, g_sum, out)
        return self.fallbacks[name].per_sample(call, layout, batch, out)  # hooks idle

    def _backward(self, loss: torch.Tensor, calls: dict[str, list[Call]], retain: bool) -> None:
        """``loss.backward()``, which writes ``param.grad`` (and the inputs' ``.grad``) as a
        plain step does, with the gradients at the calls' outputs captured on the way (into
        their ``grads``): by pre-hooks on the nodes that made them as they were returned (an
        output changed in place since still gets its own)."""
        handles = [
            edge.node.register_prehook(_capture(call, k, edge.output_nr))
            for layer_calls in calls.values()
            for call in layer_calls
            for k, edge in enumerate(call.edges)
            if edge is not None
        ]
        try:
            if loss.requires_grad:  # else no trainable layer reached the loss
                loss.backward(retain_graph=retain)
        except RuntimeError as error:
            raise _backward_error(error) from error
        finally:
            for handle in handles:
                handle.remove()

    def _buffer_views(self, batch: int, params: dict[str, nn.Parameter], calls: dict) -> Grads:
        """Name -> ``(B, *shape)`` column blocks of the reused buffer (``{}``: write fresh).

        The buffer takes the dtype and device of the layers' floating inputs and output
        gradients; a model that mixes them gets fresh tensors instead.
        """
        if not self.reuse_buffer:
            return {}
        tensors = [
            t
            for layer_calls in calls.values()
            for call in layer_calls
            for t in (*call.leaves[:1], *call.grads)
            if isinstance(t, torch.Tensor) and t.is_floating_point()  # not Embedding's indices
        ]
        return self.grad_buffer.views(batch, params, tensors)


class FactoredPerSample(HookedPerSample):
    """``method=factored``: :class:`HookedPerSample`, but layers whose rule has a factor form that
    pays (:meth:`~grab_exp.per_sample.rules.LayerRule.factors`) keep their input and output
    gradient (:class:`~grab_exp.grads.linear.LinearFactors`) instead of ``(B, *shape)`` blocks; no
    buffer is reused."""

    method = "factored"
    factored = True


def _all_tensors(args: tuple) -> bool:
    return all(isinstance(a, torch.Tensor) for a in args)


@functools.cache
def _args_spec(count: int) -> Any:
    """The pytree structure of ``(list(args), {})`` for ``count`` tensor arguments."""
    return tree_flatten(([0] * count, {}))[1]


def _version(value: Any) -> int | None:
    return value._version if isinstance(value, torch.Tensor) else None


def _edge(tensor: torch.Tensor) -> GradientEdge:
    """Where autograd takes ``tensor``'s gradient as it is now (an in-place change later gives
    the tensor a new node; this edge keeps the old one, which the tensor's new node holds)."""
    if tensor.grad_fn is None:
        return get_gradient_edge(tensor)  # a leaf: its gradient accumulator
    return GradientEdge(tensor.grad_fn, tensor.output_nr)


def _zeros(param: nn.Parameter, batch: int, out: torch.Tensor | None) -> torch.Tensor:
    if out is not None:
        return out.zero_()
    return torch.zeros(batch, *param.shape, dtype=param.dtype, device=param.device)


def _capture(call: Call, k: int, output_nr: int):
    """A node pre-hook that keeps the gradient at the node's output ``output_nr`` as the
    gradient of ``call``'s output ``k``."""

    def hook(grad_outputs: tuple) -> None:
        call.grads[k] = grad_outputs[output_nr]

    return hook


def _added(rows: Any, more: Any, name: str) -> Any:
    """The rows of a parameter that two layers share: their sum."""
    if more is None:
        return rows
    if rows is None:
        return more
    if not isinstance(rows, torch.Tensor) or not isinstance(more, torch.Tensor):
        raise UnsupportedModelError(
            f"{name} is shared by two layers, whose factored rows cannot be added; use "
            "method=hooks or func"
        )
    return rows.add_(more)


def _reached_leaves(root: Any, skip: dict) -> set[int]:
    """``id``s of the leaf tensors whose gradient nodes the graph from ``root`` reaches, stepping
    from each node in ``skip`` to the nodes it names instead of its own inputs."""
    reached, seen, stack = set(), set(), [root]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if node in skip:
            stack.extend(skip[node])
        elif hasattr(node, "variable"):
            reached.add(id(node.variable))
        else:
            stack.extend(n for n, _ in node.next_functions)
    return reached


def _backward_error(error: RuntimeError) -> Exception:
    """A backward that torch refused, in one line where the cause is known."""
    if "Checkpointing is not compatible" in str(error):
        return UnsupportedModelError(CHECKPOINT_REFUSAL)
    return error
