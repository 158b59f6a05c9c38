"""Per-sample gradients from one backward pass, with per-layer hooks.

Forward hooks keep every trainable layer's inputs and outputs; one backward pass computes only
the gradients at those outputs (``torch.autograd.grad``: no parameter gradient is formed twice),
and each layer's per-sample and mean gradients come from its inputs and output gradients, the
mean written to ``param.grad`` for the optimizer:

* a layer with a rule (:mod:`grab_exp.per_sample.rules`: Linear, Conv2d, Embedding, LayerNorm)
  uses its closed form;
* any other layer with trainable parameters of its own (GroupNorm, grouped Conv2d,
  RNN/LSTM/GRU, MultiheadAttention, BatchNorm in eval mode, a custom module with an
  ``nn.Parameter``) gets the per-layer fallback (:mod:`grab_exp.per_sample.fallback`): only that
  layer is re-run, the rest of the model keeps its rules.

The first call probes where each layer's tensors carry the batch
(:mod:`grab_exp.per_sample.layout`): rules and fallbacks then read the batch from that dimension
(sequence-first layouts), a layer whose input has no batch dimension (a position embedding) gets
its input expanded over the batch, a layer called several times sums its calls, and a submodule
whose parameters its parent uses without calling it (``MultiheadAttention.out_proj``) is
differentiated with the parent. The first call then checks the result against a per-example
computation (:mod:`grab_exp.per_sample.verify`). Dropout modules in training mode are right as
they are: a layer's saved input carries the masks the batch forward drew.

When an output was modified in place after its layer or ``x`` requires grad, a plain
``loss.backward()`` (tensor hooks catch the output gradients) is used instead.

Refused (``UnsupportedModelError``, one line naming the layer; ``method=func`` may cover them): a
parameter shared by two modules (tied weights), a layer whose replay would draw random numbers
(attention or RNN dropout in training mode), a layer that mixes the examples of a batch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_flatten

from grab_exp.grads import BatchGrads, as_batch_grads
from grab_exp.per_sample.base import LossFn, PerSampleGradients
from grab_exp.per_sample.buffer import GradBuffer
from grab_exp.per_sample.fallback import FuncFallback
from grab_exp.per_sample.layout import Call, CallLayout, expand_over_batch, shape_of
from grab_exp.per_sample.modules import UnsupportedModelError, draws_random
from grab_exp.per_sample.rules import LayerRule, rule_for

Grads = dict[str, torch.Tensor]

__all__ = ["FactoredPerSample", "HookedPerSample", "UnsupportedModelError", "check_supported"]


def check_supported(model: nn.Module) -> None:
    """Raise ``UnsupportedModelError`` naming the first parameter shared by two modules (tied
    weights): a layer's hooks see only that layer's use of it."""
    owners: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        tied = [owners[id(p)] for p in own if owners.setdefault(id(p), name) != name]
        if tied:
            raise UnsupportedModelError(
                f"{name or '<root>'} (shares a parameter with {tied[0]}): the hook path cannot "
                "compute its per-sample gradients; use method=func"
            )


def _label(name: str, module: nn.Module) -> str:
    return f"{name or '<root>'} ({type(module).__name__})"


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

    Attributes:
        rules: layer name -> its :class:`~grab_exp.per_sample.rules.LayerRule`.
        fallbacks: layer name -> its :class:`~grab_exp.per_sample.fallback.FuncFallback` (the
            layers without a rule, and those that adopted a submodule's parameters).
        expanded: names of the layers whose input is expanded over the batch.
        layouts: layer name -> the probed :class:`~grab_exp.per_sample.layout.CallLayout` of each
            of its calls in one forward.
        grad_buffer: the reused buffer (its ``buffer`` ``(rows >= B, d)`` once a call made it).
    """

    method = "hooks"
    factored = False  # rules return factors where they pay (FactoredPerSample)
    module_dropout = True

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, reuse_buffer: bool = False) -> None:
        super().__init__(model, loss_fn)
        check_supported(model)
        self.reuse_buffer = reuse_buffer and not self.factored
        self.grad_buffer = GradBuffer()
        self._params = list(model.named_parameters())  # read once, not walked every call
        self._modules = dict(model.named_modules())
        self._layers: dict[str, nn.Module] = {}
        self._own: dict[str, dict[str, nn.Parameter]] = {}  # layer -> name -> its parameter
        self.rules: dict[str, LayerRule] = {}
        self.fallbacks: dict[str, FuncFallback] = {}
        self.expanded: set[str] = set()
        self.layouts: dict[str, list[CallLayout]] = {}
        self._handles: dict[str, list[Any]] = {}
        self._mode = "idle"  # record (this path's forward) | probe | idle (any other forward)
        self._batch = 0
        self._calls: dict[str, list[Call]] = {}
        for name, m in model.named_modules():
            if any(p.requires_grad for p in m.parameters(recurse=False)):
                self._add_layer(name, m)

    # ------------------------------------------------------------------ layers and hooks

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
            if name in self.expanded and self._mode != "idle":
                return expand_over_batch(args, self._batch), kwargs
            return None

        return hook

    def _forward_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if self._mode == "idle":
                return
            leaves, spec = tree_flatten((list(args), kwargs))
            outputs = tree_flatten(output)[0]
            leaves = [t.detach() if isinstance(t, torch.Tensor) else t for t in leaves]
            versions = [t._version if isinstance(t, torch.Tensor) else 0 for t in outputs]
            call = Call(leaves, spec, outputs, versions, [None] * len(outputs))
            self._calls.setdefault(name, []).append(call)
            if self._mode == "record":  # registered now, they see the output's gradient even
                for k, t in enumerate(outputs):  # if it is changed in place later
                    if isinstance(t, torch.Tensor) and t.requires_grad:
                        t.register_hook(_setter(call.grads, k))

        return hook

    # ------------------------------------------------------------------ the probe

    def _prepare(self, x: torch.Tensor) -> None:
        """Probe the layouts on copies of ``x``'s first example; settle adoptions and expansions.

        Each round probes the model; a layer that did not run gives its parameters to its parent
        module, a layer whose input has no batch dimension gets it expanded, and the model is
        probed again, until nothing changes.
        """
        self.expanded.clear()
        for _ in range(2 * len(self._modules) + 1):
            two, three = self._probes(x)
            silent = [name for name in self._layers if name not in two]
            if silent:
                self._adopt(silent[0])
                continue
            layouts = {name: self._layouts(name, two, three) for name in self._layers}
            unbatched = {n for n, calls in layouts.items() if any(not c.batched for c in calls)}
            if unbatched <= self.expanded:
                self.layouts = layouts
                return
            self.expanded |= unbatched
        raise AssertionError("unreachable: every round adopts or expands one more layer")

    def _probes(self, x: torch.Tensor) -> tuple[dict, dict]:
        """:meth:`_probe` with 2 and with 3 copies of ``x``'s first example; a forward that the
        expansion of unbatched inputs breaks is refused by the expanded layers' names."""
        try:
            return self._probe(x[[0, 0]]), self._probe(x[[0, 0, 0]])
        except RuntimeError as error:
            if not self.expanded:
                raise
            layers = ", ".join(_label(n, self._layers[n]) for n in sorted(self.expanded))
            cause = str(error).strip().splitlines()[0]
            raise UnsupportedModelError(
                f"{layers}: its input has no batch dimension, and with that input expanded over "
                f"the batch the model's forward fails ({cause}); use method=func"
            ) from error

    def _probe(self, x: torch.Tensor) -> dict[str, list[tuple]]:
        """Every hooked call's ``(input shapes, output shapes)`` in one forward of ``x``."""
        self._calls, self._batch = {}, len(x)
        with self._in_mode("probe"), torch.enable_grad():  # as in training (no inference paths)
            self.model(x)
        calls, self._calls = self._calls, {}
        return {
            n: [(shape_of(c.leaves), shape_of(c.outputs)) for c in cs] for n, cs in calls.items()
        }

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

    def _compute(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """Forward and backward on ``x (B, ...)``, ``y (B,)``."""
        if not self.layouts:
            self._prepare(x)
        batch = x.shape[0]
        self._calls, self._batch = {}, batch
        with self._in_mode("record"):
            logits = self.model(x)
        loss = self.loss_fn(logits, y)
        calls, self._calls = self._calls, {}
        self._check_calls(calls)
        targeted = self._backward(loss, x, calls)
        trainable = [n for n, p in self._params if p.requires_grad]
        views = self._buffer_views(batch, trainable, calls)
        per_layer: Grads = {}
        for name in self._layers:
            names = list(self._own[name])
            out = [views.get(n) for n in names]
            grads, means = self._layer_grads(name, calls.get(name, []), batch, out, targeted)
            per_layer.update(zip(names, grads, strict=True))
            if targeted:
                _add_to_grad(self._own[name].values(), means)
        grads = {n: per_layer[n] for n in trainable}  # named_parameters order
        if self.factored:
            shapes = {n: p.shape for n, p in self._params if p.requires_grad}
            return loss.detach(), BatchGrads.from_parts(grads, shapes)
        return loss.detach(), as_batch_grads(grads)

    def _check_calls(self, calls: dict[str, list[Call]]) -> None:
        """Refuse a layer that ran a different number of times than in the probe, and a
        replayed layer that would draw random numbers."""
        for name, layer in self._layers.items():
            if len(calls.get(name, [])) != len(self.layouts.get(name, [])):
                raise UnsupportedModelError(
                    f"{_label(name, layer)} ran {len(calls.get(name, []))} times in this forward "
                    f"and {len(self.layouts.get(name, []))} in the probe of the first batch "
                    "(control flow that depends on the data); use method=func"
                )
            fallback = self.fallbacks.get(name)  # a rule's layer replays nothing
            drawn = [n for n, m in (fallback.random if fallback else ()) if draws_random(m)]
            if drawn:
                where = f" in {drawn[0]}" if drawn[0] else ""
                raise UnsupportedModelError(
                    f"{_label(name, layer)} draws random numbers{where} (dropout in training "
                    "mode) that replaying the layer for its per-sample gradients cannot "
                    "reproduce; set that dropout to 0, or use method=func with "
                    "randomness='different'"
                )

    def _layer_grads(
        self, name: str, calls: list[Call], batch: int, out: list, with_mean: bool
    ) -> tuple[list, list | None]:
        """One layer's per-sample grads ``[(B, *p.shape)]`` (its calls summed) and, with
        ``with_mean``, its mean grads."""
        total: list | None = None
        means: list | None = None
        for call, layout in zip(calls, self.layouts[name], strict=True):
            if all(g is None for g in call.grads):
                continue  # this call's outputs did not reach the loss
            grads, mean = self._call_grads(name, call, layout, batch, out, len(calls) > 1)
            if total is None:
                total, means, out = grads, mean, [None] * len(out)
                continue
            total = [t if g is None else t.add_(g) for t, g in zip(total, grads, strict=True)]
            if with_mean:
                means = [m if g is None else m.add_(g) for m, g in zip(means, mean, strict=True)]
        if total is None:  # the layer did not reach the loss
            own = self._own[name].values()
            total = [_zeros(p, batch, o) for p, o in zip(own, out, strict=True)]
            means = [torch.zeros_like(p) for p in own]
        return total, means if with_mean else None

    def _call_grads(
        self, name: str, call: Call, layout: CallLayout, batch: int, out: list, several: bool
    ) -> tuple[list, list]:
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
            g = call.grads[0].movedim(layout.outputs[0], 0)  # (B, ...), of the mean loss
            g_sum = g * batch
            factors = rule.factors(layer, a, g_sum) if self.factored and not several else None
            grads = factors or rule.per_sample(layer, a, g_sum, out)
            return grads, rule.mean(layer, a, g, grads)
        fallback = self.fallbacks[name]
        grads = fallback.per_sample(call, layout, batch, out)  # hooks idle: not recording
        return grads, fallback.mean(batch, grads)

    def _backward(self, loss: torch.Tensor, x: torch.Tensor, calls: dict[str, list[Call]]) -> bool:
        """Fill every call's ``grads``; True if only they were computed (no ``param.grad``)."""
        targets = [
            (call, k)
            for layer_calls in calls.values()
            for call in layer_calls
            for k, t in enumerate(call.outputs)
            if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        changed = any(call.outputs[k]._version != call.versions[k] for call, k in targets)
        if x.requires_grad or changed:
            loss.backward()  # the forward hooks' tensor hooks catch the output gradients
            return False
        if not targets:  # no trainable layer reached the loss
            return True
        grads = torch.autograd.grad(
            loss, [call.outputs[k] for call, k in targets], allow_unused=True
        )
        for (call, k), g in zip(targets, grads, strict=True):
            call.grads[k] = g
        return True

    def _buffer_views(self, batch: int, trainable: list[str], calls: dict) -> Grads:
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
        return self.grad_buffer.views(self.model, batch, trainable, tensors)


class FactoredPerSample(HookedPerSample):
    """``method=factored``: :class:`HookedPerSample`, but layers whose rule has a factor form that
    pays (:meth:`~grab_exp.per_sample.rules.LayerRule.factors`) keep their input and output
    gradient (:class:`~grab_exp.grads.linear.LinearFactors`) instead of ``(B, *shape)`` blocks; no
    buffer is reused."""

    method = "factored"
    factored = True


def _setter(grads: list, k: int):
    def hook(grad: torch.Tensor) -> None:
        grads[k] = grad

    return hook


def _zeros(param: nn.Parameter, batch: int, out: torch.Tensor | None) -> torch.Tensor:
    if out is not None:
        return out.zero_()
    return torch.zeros(batch, *param.shape, dtype=param.dtype, device=param.device)


def _add_to_grad(params: Iterable[nn.Parameter], means: list[torch.Tensor | None]) -> None:
    """Add the mean gradients of a layer's ``params`` to the trainable ones' ``.grad``."""
    for param, mean in zip(params, means, strict=True):
        if param.requires_grad and mean is not None:
            param.grad = mean if param.grad is None else param.grad.add_(mean)
