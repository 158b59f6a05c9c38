"""Per-sample gradients from one backward pass, with per-layer hooks.

Forward hooks keep every trainable layer's input and output; one backward pass computes only the
gradients at those outputs (``torch.autograd.grad``: no parameter gradient is formed twice), and
each layer's per-sample and mean gradients come from its input and output gradient, the mean
written to ``param.grad`` for the optimizer:

* a layer with a rule (:mod:`grab_exp.per_sample.rules`: Linear, Conv2d, LayerNorm) uses its
  closed form;
* any other layer with trainable parameters of its own (GroupNorm, grouped Conv2d, Embedding,
  BatchNorm in eval mode, a custom module with an ``nn.Parameter``) gets the per-layer
  ``torch.func`` fallback (:mod:`grab_exp.per_sample.fallback`): only that layer is re-run
  under ``vmap``, the rest of the model keeps its rules.

When an output was modified in place after its layer, a layer ran twice, or ``x`` requires grad,
a plain ``loss.backward()`` (tensor hooks catch the output gradients) is used instead.

Still unsupported (``UnsupportedModelError``; ``method=func``,
:mod:`grab_exp.per_sample.func`, covers them): a parameter shared by two modules (tied
weights: a layer's hooks see only its own use), and a module whose parameters are used by
another module's forward (e.g. ``nn.ParameterList``), and active dropout (the model check of
:class:`~grab_exp.per_sample.base.PerSampleGradients`).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from grab_exp.grads import BatchGrads, as_batch_grads
from grab_exp.per_sample.base import LossFn, PerSampleGradients
from grab_exp.per_sample.buffer import GradBuffer
from grab_exp.per_sample.fallback import FuncFallback, fallback_problem
from grab_exp.per_sample.rules import LayerRule, rule_for

Grads = dict[str, torch.Tensor]


class UnsupportedModelError(ValueError):
    """The model has a trainable layer that the hook path cannot handle."""


def _unsupported_reason(module: nn.Module) -> str | None:
    if type(module).forward is nn.Module.forward:
        return f"{type(module).__name__} without a forward: another module uses its parameters"
    return None


def check_supported(model: nn.Module) -> None:
    """Raise ``UnsupportedModelError`` naming the first layer the hooks cannot handle.

    A parameter shared by two modules (tied weights) is unsupported: a layer's hooks see only
    that layer's use of it. So is a module with parameters but no forward of its own.
    """
    owners: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        tied = [owners[id(p)] for p in own if owners.setdefault(id(p), name) != name]
        reason = f"shares a parameter with {tied[0]}" if tied else None
        reason = reason or (_unsupported_reason(module) if own else None)
        if reason is not None:
            raise UnsupportedModelError(
                f"{name or '<root>'} ({reason}): the hook path cannot compute its per-sample "
                "gradients; use method=func"
            )


class HookedPerSample(PerSampleGradients):
    """``method=hooks``: per-sample gradients from one backward pass; per-layer rules, else
    ``torch.func``.

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
            layers without a rule).
        grad_buffer: the reused buffer (its ``buffer`` ``(rows >= B, d)`` once a call made it).

    A call runs one forward and one backward. Gradients count each parameter's use by its own
    layer only (tied weights are refused); a layer called twice in one forward, an output changed
    in place, or ``x`` that requires grad switch to a plain ``loss.backward()``.
    """

    method = "hooks"
    factored = False  # rules return factors where they pay (FactoredPerSample)

    def __init__(self, model: nn.Module, loss_fn: LossFn, *, reuse_buffer: bool = False) -> None:
        super().__init__(model, loss_fn)
        check_supported(model)
        self.reuse_buffer = reuse_buffer and not self.factored
        self.grad_buffer = GradBuffer()
        self._layers: dict[str, nn.Module] = {}
        self._names: dict[str, list[str]] = {}  # layer -> its own parameters' model-level names
        self._own: dict[str, list[nn.Parameter]] = {}  # layer -> its own parameters
        self._params = list(model.named_parameters())  # read once, not walked every call
        self.rules: dict[str, LayerRule] = {}
        self.fallbacks: dict[str, FuncFallback] = {}
        for name, m in model.named_modules():
            if any(p.requires_grad for p in m.parameters(recurse=False)):
                self._add_layer(name, m)
        self._replaying = False  # True while a fallback re-runs its layer: hooks stay quiet
        self._inputs: dict[str, tuple[tuple[Any, ...], dict[str, Any]]] = {}  # args, kwargs
        self._outputs: dict[str, tuple[torch.Tensor, int]] = {}  # output, its version
        self._out_grads: dict[str, torch.Tensor] = {}

    def _add_layer(self, name: str, layer: nn.Module) -> None:
        rule = rule_for(layer)
        if rule is not None:
            self.rules[name] = rule
        else:
            self.fallbacks[name] = FuncFallback(layer)
        self._layers[name] = layer
        prefix = f"{name}." if name else ""
        self._names[name] = [prefix + n for n, _ in layer.named_parameters(recurse=False)]
        self._own[name] = list(layer.parameters(recurse=False))
        layer.register_forward_hook(self._forward_hook(name), with_kwargs=True)

    def _forward_hook(self, name: str):
        def hook(module: nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
            if self._replaying or not torch.is_grad_enabled():
                return
            problem = fallback_problem(args, kwargs, output) if name in self.fallbacks else None
            if problem is not None:
                label = f"{name or '<root>'} ({type(module).__name__})"
                raise UnsupportedModelError(f"{label} {problem}; use method=func")
            detached = tuple(a.detach() if isinstance(a, torch.Tensor) else a for a in args)
            self._inputs[name] = (detached, kwargs)
            called_before = name in self._outputs  # twice in one forward: plain backward
            self._outputs[name] = (output, -1 if called_before else output._version)
            output.register_hook(lambda grad: self._out_grads.__setitem__(name, grad))

        return hook

    def _compute(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        """Forward and backward on ``x (B, ...)``, ``y (B,)``."""
        self._inputs.clear()
        self._outputs.clear()
        loss = self.loss_fn(self.model(x), y)
        self._check_all_ran()
        targeted = self._backward(loss, x)
        batch = x.shape[0]
        trainable = [n for n, p in self._params if p.requires_grad]
        views = self._buffer_views(batch, trainable)
        per_layer: Grads = {}
        for name in self._layers:
            names = self._names[name]
            grads, means = self._layer_grads(name, batch, [views.get(n) for n in names], targeted)
            per_layer.update(zip(names, grads, strict=True))
            if targeted:
                _add_to_grad(self._own[name], means)
        self._inputs.clear()
        self._out_grads.clear()
        grads = {n: per_layer[n] for n in trainable}  # named_parameters order
        if self.factored:
            shapes = {n: p.shape for n, p in self._params if p.requires_grad}
            return loss.detach(), BatchGrads.from_parts(grads, shapes)
        return loss.detach(), as_batch_grads(grads)

    def _check_all_ran(self) -> None:
        missing = [name for name in self._layers if name not in self._inputs]
        if missing:
            name = missing[0]
            raise UnsupportedModelError(
                f"{name or '<root>'} ({type(self._layers[name]).__name__}) did not run in the "
                "forward (is another module using its parameters?); use method=func"
            )

    def _layer_grads(
        self, name: str, batch: int, out: list[torch.Tensor | None], with_mean: bool
    ) -> tuple[list, list | None]:
        """One layer's per-sample grads ``[(B, *p.shape)]`` and (``with_mean``) mean grads."""
        layer, (args, kwargs), g = self._layers[name], self._inputs[name], self._out_grads[name]
        rule, g_sum = self.rules.get(name), g * batch  # g, of the mean, has 1/B
        if rule is not None:
            factors = rule.factors(layer, args[0], g_sum) if self.factored else None
            grads = factors or rule.per_sample(layer, args[0], g_sum, out)
            return grads, rule.mean(layer, args[0], g, grads) if with_mean else None
        fallback = self.fallbacks[name]
        self._replaying = True
        try:
            grads = fallback.per_sample(args, kwargs, g_sum, out)
        finally:
            self._replaying = False
        return grads, fallback.mean(g, grads) if with_mean else None

    def _backward(self, loss: torch.Tensor, x: torch.Tensor) -> bool:
        """Fill ``_out_grads``; True if only they were computed (no ``param.grad`` yet)."""
        outputs, self._outputs = self._outputs, {}
        if x.requires_grad or any(out._version != v for out, v in outputs.values()):
            loss.backward()  # e.g. an output changed in place: hooks see the original's grad
            return False
        grads = torch.autograd.grad(loss, [out for out, _ in outputs.values()])
        self._out_grads.update(zip(outputs, grads, strict=True))
        return True

    def _buffer_views(self, batch: int, trainable: list[str]) -> Grads:
        """Name -> ``(B, *shape)`` column blocks of the reused buffer (``{}``: write fresh).

        The buffer takes the dtype and device of the layers' first inputs and output gradients;
        a model that mixes them gets fresh tensors instead.
        """
        if not self.reuse_buffer:
            return {}
        firsts = [args[0] for args, _ in self._inputs.values()]
        tensors = [
            t
            for t in (*firsts, *self._out_grads.values())
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


def _add_to_grad(params: list[nn.Parameter], means: list[torch.Tensor | None]) -> None:
    """Add the mean gradients of a layer's own ``params`` to the trainable ones' ``.grad``."""
    for param, mean in zip(params, means, strict=True):
        if param.requires_grad:
            param.grad = mean if param.grad is None else param.grad.add_(mean)
