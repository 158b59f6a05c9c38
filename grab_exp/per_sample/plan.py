"""The hook path's layers (:class:`Layers`) and the plan of each kind of batch (:class:`Planner`,
from a probe on copies of its first example: :mod:`.layout`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from grab_exp.per_sample.check.state import (
    drew_since,
    generator_states,
    kept_state,
    random_modules_off,
    set_generator_states,
)
from grab_exp.per_sample.check.tolerance import OUTPUT_TOLERANCE, tolerance
from grab_exp.per_sample.fallback import FuncFallback
from grab_exp.per_sample.layout import (
    Call,
    CallLayout,
    Inputs,
    OutputLayout,
    call_model,
    input_shapes,
    shape_of,
    take,
)
from grab_exp.per_sample.modules import UnsupportedModelError, draws_random, first_line, label
from grab_exp.per_sample.rules import LayerRule, rule_for


@dataclass
class Plan:
    """What the probe of one kind of batch found: each layer's calls' layouts, the layers whose
    input is expanded over the batch (a position embedding), where the output has the batch;
    ``reindexes``: a full check found ``h[sel]`` or the like (every call is then checked)."""

    layouts: dict[str, list[CallLayout]]
    expanded: set[str]
    output: OutputLayout
    reindexes: bool = False


@dataclass
class Layers:
    """The hooked layers by name: its parameters by qualified name (``own``) and where each is
    registered (``slots``: module, name, parameter), its rule or fallback, its hooks; ``idle``:
    those silent in a probe whose parameters the output skips."""

    modules: dict[str, nn.Module] = field(default_factory=dict)
    own: dict[str, dict[str, nn.Parameter]] = field(default_factory=dict)
    slots: dict[str, list[tuple[nn.Module, str, nn.Parameter]]] = field(default_factory=dict)
    rules: dict[str, LayerRule] = field(default_factory=dict)
    fallbacks: dict[str, FuncFallback] = field(default_factory=dict)
    idle: set[str] = field(default_factory=set)
    handles: dict[str, list[Any]] = field(default_factory=dict)

    def add(self, name: str, layer: nn.Module, hook, adopted: tuple[str, ...] = ()) -> None:
        rule = None if adopted else rule_for(layer)
        (self.rules if rule else self.fallbacks)[name] = rule or FuncFallback(
            layer, adopted, label(name, layer)
        )
        self.modules[name] = layer
        prefix = f"{name}." if name else ""
        own = [n for n, _ in layer.named_parameters(recurse=False)]  # a rule's rows: weight, bias
        own = sorted(own, key=("weight", "bias").index) if rule else own + list(adopted)
        self.own[name] = {prefix + n: layer.get_parameter(n) for n in own}
        places = [(layer.get_submodule(n.rpartition(".")[0]), n.rpartition(".")[2]) for n in own]
        self.slots[name] = [(m, n, m._parameters[n]) for m, n in places]
        self.handles[name] = hook(name, layer, rule is None)

    def drop(self, name: str) -> None:
        for handle in self.handles.pop(name):
            handle.remove()
        for table in (self.modules, self.rules, self.fallbacks, self.own, self.slots):
            table.pop(name, None)

    def remove(self) -> None:
        for name in list(self.handles):
            self.drop(name)

    def label(self, name: str) -> str:
        return label(name, self.modules[name])


class Planner:
    """Hooks the model's trainable layers into ``layers`` (``recorder.hook``) and probes each
    kind of batch; ``plan``: the current one's (``None`` before the first call)."""

    def __init__(self, model: nn.Module, layers: Layers, recorder) -> None:
        self.model, self.layers, self.recorder = model, layers, recorder
        self.modules = dict(model.named_modules())
        self.plans: dict[tuple, Plan] = {}
        self.plan: Plan | None = None
        for name, m in self.modules.items():
            if any(p.requires_grad for p in m.parameters(recurse=False)):
                layers.add(name, m, recorder.hook)

    def use_plan(self, x: Inputs, modes: tuple = ()) -> tuple:
        """Select (probing it if new) the plan of ``x``'s kind of batch and ``modes``; its key."""
        key = (input_shapes(x), modes)
        if (plan := self.plans.get(key)) is None:
            plan = self.plans[key] = self._prepare(x)
        self.plan, self.recorder.expanded = plan, plan.expanded
        return key

    def _prepare(self, x: Inputs) -> Plan:
        """Probe until nothing changes: a layer that did not run gives its parameters to its
        parent module (idle if the output does not use them: for this kind of batch only), one
        whose input has no batch dimension gets it expanded."""
        layers, self._start = self.layers, generator_states()  # every probe draws from there
        layers.idle.clear()
        expanded = self.recorder.expanded = set()
        plain = None
        for _ in range(2 * len(self.modules) + 1):
            two, three, outputs, calls, silent, used = self._probes(x, expanded)
            plain = plain if expanded else outputs[1]  # 3 copies' outputs, no input expanded
            if silent:
                layers.idle.update(n for n in silent if n not in used)
                if adopted := [n for n in silent if n in used]:
                    self._adopt(adopted[0])
                continue
            running = [n for n in layers.modules if n not in layers.idle]
            if expanded:
                self._refuse_other_draws(x, expanded)  # first: other draws change the outputs
                self._refuse_spread(outputs, plain, calls, (two, three), expanded)
            layouts = {name: self._layouts(name, two, three) for name in running}
            unbatched = {n for n, cs in layouts.items() if any(set(c.inputs) <= {None} for c in cs)}
            if mixed := [n for n in unbatched if any(set(c.inputs) - {None} for c in layouts[n])]:
                raise UnsupportedModelError(
                    f"{self.layers.label(mixed[0])} is called on inputs with a batch dimension "
                    "and on inputs without one (a position table) in one forward, and the hook "
                    "path batches a layer's calls all or none; use method=func (auto does)"
                )
            if not (new := [n for n in calls if n in unbatched - expanded]):
                output = OutputLayout.probed(*outputs, "; use method=loop (auto takes it)")
                return Plan(layouts, set(expanded), output)
            expanded.add(new[0])  # the first that ran: a layer after it may read its output
        raise AssertionError("unreachable: every round adopts or expands one more layer")

    def _probes(self, x: Inputs, expanded: set[str]) -> tuple[dict, dict, tuple, dict, list, set]:
        """:meth:`_probe` of 2 and 3 copies of an example (the calls of 3); silent layers, those
        the output uses."""
        with kept_state(self.model), random_modules_off(self.model):  # masks alike in each probe
            try:
                (two, out2, _), (three, out3, calls) = self._probe(x, 2), self._probe(x, 3)
            except Exception as error:  # torch's shape checks raise AssertionError too (MHA)
                if not expanded:
                    raise
                names = ", ".join(self.layers.label(n) for n in sorted(expanded))
                cause = first_line(error)
                raise UnsupportedModelError(
                    f"{names}: its input has no batch dimension for copies of one example (a "
                    "position embedding's; or a selection by value, as x[mask] or expert routing, "
                    "that picked none), and with that input expanded over the batch the model's "
                    f"forward fails ({cause}); use method=func or loop (auto tries them)"
                ) from error
            silent = [n for n in self.layers.modules if n not in two and n not in self.layers.idle]
            used = self._used(silent, out3) if silent else set()  # out2: its graph may be stale
        return two, three, (out2, out3), calls, silent, used

    def _probe(self, x: Inputs, copies: int) -> tuple[dict[str, list[tuple]], Any, dict]:
        recorder = self.recorder
        recorder.calls, recorder.batch = {}, copies
        set_generator_states(self._start)  # the caller's kept_state forks the generators
        with recorder.in_mode("probe"), torch.enable_grad():  # as in training: no inference paths
            out = call_model(self.model, take(x, [0] * copies))
            recorder.settle_buffers(recorder.calls)
        self.drew = drew_since(self._start)
        calls, recorder.calls = recorder.calls, {}
        shapes = {
            n: [(shape_of(c.leaves), shape_of(c.outputs)) for c in cs] for n, cs in calls.items()
        }
        return shapes, out, calls

    def _used(self, silent: list[str], out: Any) -> set[str]:
        leaves = [t for t in tree_flatten(out)[0] if torch.is_tensor(t) and t.requires_grad]
        params = [(n, p) for n in silent for p in self.layers.own[n].values()]
        if not leaves or not params:
            return set()
        total = sum(t.float().sum() for t in leaves)
        grads = torch.autograd.grad(total, [p for _, p in params], allow_unused=True)
        return {n for (n, _), g in zip(params, grads, strict=True) if g is not None}

    def _refuse_spread(self, outputs: tuple, plain: Any, calls: dict, probes: tuple, expanded):
        """Refuse expanded layers unless, in the probe of 3 copies (their ``calls``), each copy
        serves its own example alone: the model's outputs are ``plain``'s (none expanded: no
        statistic over the copies, detached or not), each copy's output reaches its own copy of
        the layers' outputs alone (not ``(T, D)`` broadcast onto ``(B, T, D)`` at T = 1), and all
        outputs together reach every copy alike (not one copy read for all, ``c[0]``, a max)."""
        leaves = tree_flatten(outputs[1])[0]
        try:
            dims = OutputLayout.probed(*outputs).dims
        except UnsupportedModelError:  # the copies along dimension 0, as (3, 3, V) has them
            dims = [0 if torch.is_tensor(t) and t.shape[:1] == (3,) else None for t in leaves]
        graded = [(t, d) for t, d in zip(leaves, dims, strict=True) if torch.is_tensor(t)]
        graded = [(t, d) for t, d in graded if t.requires_grad]
        outs = [
            (name, t, d)
            for name in expanded & set(probes[0]) & set(calls)
            for call, layout in zip(calls[name], self._layouts(name, *probes), strict=True)
            for t, d in zip(call.outputs, layout.outputs, strict=True)
            if torch.is_tensor(t) and t.requires_grad and d is not None
        ]
        spread = [] if _same(plain, outputs[1]) else sorted(expanded)
        tensors = [t for _, t, _ in outs]
        copies = (0, 1, 2) if self.drew else (0, 1, 2, None)  # None: all outputs, copies alike
        for k in copies if outs and graded and not spread else ():  # (each copy, its own draws)
            ends = [
                (t if k is None else t.narrow(d, k, 1)).sum()
                for t, d in graded
                if k is None or d is not None
            ]
            grads = torch.autograd.grad(sum(ends), tensors, retain_graph=True, allow_unused=True)
            spread = [n for (n, _, d), g in zip(outs, grads, strict=True) if _spread(g, d, k)]
            if spread:
                break
        if spread:
            raise UnsupportedModelError(
                f"{self.layers.label(spread[0])}: its input has no batch dimension (as "
                "arange(T)), and given one the examples do not each read their own copy of its "
                "output alone (broadcast along another axis, as (T, D) onto (B, T, D) at T = 1; "
                "one copy read for all; a value over the copies); use method=func (auto does)"
            )

    def _refuse_other_draws(self, x: Inputs, expanded: set[str]) -> None:
        """Refuse expanded layers where, given the batch, the model draws other random numbers
        than without it, from one state of the generators (a dropout on a position table draws
        a mask per example where the model draws one for all: another forward, other numbers)."""
        copies, recorder, drawn = take(x, [0] * 3), self.recorder, []
        with kept_state(self.model), torch.enable_grad():  # the generators forked
            start = generator_states()
            for mode in ("idle", "probe"):  # the model's own forward, then with the expansion
                set_generator_states(start)
                recorder.calls, recorder.batch = {}, 3
                with recorder.in_mode(mode):
                    call_model(self.model, copies)
                drawn.append(generator_states())
            other = drew_since(drawn[0])  # the expanded forward's end against the model's
            recorder.calls = {}
        if other:
            names = ", ".join(self.layers.label(n) for n in sorted(expanded))
            raise UnsupportedModelError(
                f"{names}: its input has no batch dimension (as arange(T)), and given one the "
                "model draws other random numbers than its own forward (a dropout or noise on "
                "its output draws a mask per example where the model draws one for the batch); "
                "use method=func (auto does)"
            )

    def _layouts(self, name: str, two: dict, three: dict) -> list[CallLayout]:
        if len(two[name]) != len(three.get(name, [])):
            raise UnsupportedModelError(
                f"{self.layers.label(name)} runs a different number of times for two examples "
                "and for three; use method=func"
            )
        try:
            return [CallLayout.probed(a, b) for a, b in zip(two[name], three[name], strict=True)]
        except ValueError as error:
            message = f"{self.layers.label(name)} {error}; use method=func"
            raise UnsupportedModelError(message) from None

    def _adopt(self, name: str) -> None:
        """Differentiate ``name``'s parameters with its parent's replay (which uses them without
        calling ``name``: ``MultiheadAttention.out_proj``)."""
        layers = self.layers
        owner = name.rpartition(".")[0]  # "" for a top-level layer: the root
        adopted = [n.removeprefix(f"{owner}.") for n in layers.own[name]]
        if owner in layers.modules:
            previous = layers.fallbacks[owner].adopted if owner in layers.fallbacks else []
            adopted = [*previous, *adopted]
            layers.drop(owner)
        layers.drop(name)
        layers.add(owner, self.modules[owner], self.recorder.hook, tuple(adopted))

    def call_layouts(self, name: str, calls: list[Call]) -> list[tuple[Call, CallLayout]]:
        layouts = self.plan.layouts.get(name, []) if self.plan else []
        return [(call, layouts[min(k, len(layouts) - 1)]) for k, call in enumerate(calls)]

    def check_calls(self, calls: dict[str, list[Call]]) -> None:
        """Refuse a layer that ran where the probe did not see it, or a different number of times
        with calls of different layouts, and a replayed layer that would draw random numbers."""
        for name in self.layers.modules:
            ran, probed = len(calls.get(name, [])), self.plan.layouts.get(name, [])
            if ran and not probed:
                raise UnsupportedModelError(
                    f"{self.layers.label(name)} ran on this batch but not in the probe of its kind "
                    "of batch (it runs on some batches or examples only: data-dependent "
                    "control flow); use method=func"
                )
            if ran and ran != len(probed) and len(set(probed)) > 1:
                raise UnsupportedModelError(
                    f"{self.layers.label(name)} ran {ran} times in this forward and {len(probed)} "
                    "in the probe of the batch's first example, with calls of different layouts "
                    "(control flow that depends on the data); use method=func"
                )
            fallback = self.layers.fallbacks.get(name)  # a rule's layer replays nothing
            drawn = [n for n, m in (fallback.modules if fallback else ()) if draws_random(m)]
            if ran and drawn:
                where = f" in {drawn[0]}" if drawn[0] else ""
                raise UnsupportedModelError(
                    f"{self.layers.label(name)} draws random numbers{where} (dropout in training "
                    "mode) that replaying the layer for its per-sample gradients cannot reproduce;"
                    " set that dropout to 0, or use method=func with randomness='different'"
                )


def _spread(grad: torch.Tensor | None, dim: int, k: int | None) -> bool:
    """Whether a gradient from copy ``k``'s output reaches another copy (along ``dim``); from all
    outputs (``k`` None), whether the copies' gradients differ past rounding."""
    if grad is None:
        return False
    moved = grad.movedim(dim, 0)
    if k is None:
        return not _same(moved, moved[:1].expand_as(moved), moved.abs().max())
    return bool(moved[:k].any() or moved[k + 1 :].any())


def _same(a: Any, b: Any, scale: torch.Tensor | None = None) -> bool:
    """Whether two outputs (pytrees) agree up to their dtype's rounding (relative, or to
    ``scale``): the same structure, shapes and values."""
    (left, spec), (right, other) = tree_flatten(a), tree_flatten(b)
    if spec != other:
        return False
    for x, y in zip(left, right, strict=True):
        if not torch.is_tensor(x):
            continue
        if not x.is_floating_point():  # integers, masks
            if x.shape != y.shape or not torch.equal(x, y):
                return False
            continue
        rtol = tolerance(OUTPUT_TOLERANCE, x.dtype)
        if x.shape != y.shape or not torch.allclose(
            x.detach(), y.detach(), rtol=rtol, atol=0.0 if scale is None else rtol * float(scale)
        ):
            return False
    return True
