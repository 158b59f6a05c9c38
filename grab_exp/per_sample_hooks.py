"""Per-sample gradients from one backward pass, with per-layer hooks.

For ``nn.Linear`` and ``nn.Conv2d`` the gradient of one example's loss with respect to the
layer's weight is an outer product (Linear) or a correlation (Conv2d) of the layer's input and the
gradient at its output (:mod:`grab_exp.per_sample_layers`). Forward hooks keep each layer's input
and output; one backward pass computes only the gradients at the outputs
(``torch.autograd.grad``: no parameter gradient is formed twice), and the per-sample and mean
gradients both come from them, the mean written to ``param.grad`` for the optimizer. When an
output was modified in place after the layer, a plain ``loss.backward()`` (tensor hooks catch the
output gradients) is used instead.

Models with any other trainable layer are rejected (``UnsupportedModelError``); the
``torch.func`` path in :mod:`grab_exp.per_sample` covers them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from grab_exp.balance.tensors import flatten_grads
from grab_exp.per_sample import PerSampleGradients
from grab_exp.per_sample_layers import conv2d_grads, linear_grads, mean_grads

Grads = dict[str, torch.Tensor]


class UnsupportedModelError(ValueError):
    """The model has a trainable layer that the hook path cannot handle."""


def _unsupported_reason(module: nn.Module) -> str | None:
    if isinstance(module, nn.Linear):
        return None
    if isinstance(module, nn.Conv2d):
        if module.groups != 1 or module.padding_mode != "zeros":
            return "Conv2d with groups > 1 or non-zero padding_mode"
        return None
    return type(module).__name__


def check_supported(model: nn.Module) -> None:
    """Raise ``UnsupportedModelError`` naming the first layer the hooks cannot handle.

    A parameter shared by two modules (tied weights) is unsupported too: a layer's hooks see
    only that layer's use of it.
    """
    owners: dict[int, str] = {}
    for name, module in model.named_modules(remove_duplicate=False):
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        tied = [owners[id(p)] for p in own if owners.setdefault(id(p), name) != name]
        reason = f"shares a parameter with {tied[0]}" if tied else None
        reason = reason or (_unsupported_reason(module) if own else None)
        if reason is not None:
            raise UnsupportedModelError(
                f"{name or '<root>'} ({reason}): the hook path supports Linear and Conv2d; "
                "use method=func"
            )


class HookedPerSampleGradients:
    """Per-sample gradients of Linear/Conv2d models from one backward pass.

    Args:
        model: a model whose trainable layers are all ``nn.Linear`` / ``nn.Conv2d``.
        loss_fn: ``loss_fn(logits, y)`` returning the batch MEAN of per-example losses (the
            default reduction of torch's losses).
        reuse_buffer: write the per-sample gradients of every call into one reused
            ``(B, d)`` buffer (row-major, columns in ``named_parameters`` order); the returned
            tensors are views of it, so **the next call overwrites them**: consume (or clone)
            them before calling again. ``Balance.step`` then takes the buffer as its ``(B, d)``
            matrix without a copy, and no step allocates gradient-sized tensors.

    Calling it runs forward + backward: ``param.grad`` receives the mean gradient (added to
    what is there, like ``loss.backward()``) and the per-sample gradients come back. They (and
    ``param.grad`` on the fast path) count each parameter's use by its own layer only: weights
    tied to other uses are not supported. A layer called twice in one forward, an output changed
    in place, or ``x`` that requires grad switch to a plain ``loss.backward()``.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable, *, reuse_buffer: bool = False) -> None:
        PerSampleGradients(model, loss_fn).check()  # BatchNorm / Dropout errors, same wording
        check_supported(model)
        self.model, self.loss_fn = model, loss_fn
        self.reuse_buffer = reuse_buffer
        self._layers = {
            name: m
            for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d))
            and any(p.requires_grad for p in m.parameters(recurse=False))
        }
        self._shapes: dict[str, torch.Size] = {}  # trainable name -> shape: the buffer's layout
        self._buffer: torch.Tensor | None = None  # (rows >= B, d)
        self._views: dict[int, Grads] = {}  # B -> name -> (B, *shape) views of the buffer
        self._inputs: dict[str, torch.Tensor] = {}
        self._outputs: dict[str, tuple[torch.Tensor, int]] = {}  # output, its version
        self._out_grads: dict[str, torch.Tensor] = {}
        for name, layer in self._layers.items():
            layer.register_forward_hook(self._forward_hook(name))

    def _forward_hook(self, name: str):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor):
            if not torch.is_grad_enabled():
                return
            self._inputs[name] = inputs[0].detach()
            called_before = name in self._outputs  # twice in one forward: plain backward
            self._outputs[name] = (output, -1 if called_before else output._version)
            output.register_hook(lambda grad: self._out_grads.__setitem__(name, grad))

        return hook

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Grads]:
        """Forward and backward on ``x (B, ...)``, ``y (B,)``.

        Returns:
            ``(loss, grads)``: the detached mean loss ``()`` and name -> ``(B, *param.shape)``
            in ``named_parameters`` order (views of the reused buffer with ``reuse_buffer``).
        """
        self._inputs.clear()
        self._outputs.clear()
        loss = self.loss_fn(self.model(x), y)
        targeted = self._backward(loss, x)
        batch = x.shape[0]
        trainable = [n for n, p in self.model.named_parameters() if p.requires_grad]
        views = self._buffer_views(batch, trainable)
        per_layer: Grads = {}
        for name, layer in self._layers.items():
            builder = linear_grads if isinstance(layer, nn.Linear) else conv2d_grads
            names = [f"{name}.weight"] + ([f"{name}.bias"] if layer.bias is not None else [])
            out = (views.get(names[0]), views.get(names[-1]) if len(names) > 1 else None)
            a, g = self._inputs[name], self._out_grads[name]
            grads = builder(layer, a, g * batch, out)  # g, of the mean loss, carries 1/B
            per_layer.update(zip(names, grads, strict=True))
            if targeted:
                _add_to_grad(layer, mean_grads(layer, a, g, grads))
        self._inputs.clear()
        self._out_grads.clear()
        return loss.detach(), {n: per_layer[n] for n in trainable}

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

        The buffer takes the dtype and device of the layers' inputs and output gradients; a
        model that mixes them gets fresh tensors instead.
        """
        tensors = [*self._inputs.values(), *self._out_grads.values()]
        if not self.reuse_buffer or not tensors:
            return {}
        like = tensors[0]
        if any(t.dtype != like.dtype or t.device != like.device for t in tensors):
            return {}
        if list(self._shapes) != trainable:  # first call, or parameters were (un)frozen
            shapes = dict(self.model.named_parameters())
            self._shapes = {n: shapes[n].shape for n in trainable}
            self._buffer = None
        buffer = self._buffer
        if (
            buffer is None
            or len(buffer) < batch
            or buffer.dtype != like.dtype
            or buffer.device != like.device
        ):
            d = sum(shape.numel() for shape in self._shapes.values())
            self._buffer = torch.empty(batch, d, dtype=like.dtype, device=like.device)  # (B, d)
            self._views = {}
        if batch not in self._views:
            widths = [shape.numel() for shape in self._shapes.values()]
            blocks = torch.split(self._buffer[:batch], widths, dim=1)  # (B, d_i) each
            self._views[batch] = {
                n: block.view(batch, *shape)
                for (n, shape), block in zip(self._shapes.items(), blocks, strict=True)
            }
        return self._views[batch]

    def accumulate_mean(self, grads: Grads) -> None:
        """No-op: ``__call__`` already added the mean gradient to ``.grad``."""

    @staticmethod
    def flat(grads: Grads) -> torch.Tensor:
        """``(B, d)`` matrix of the per-sample gradients, columns in ``named_parameters`` order.

        With ``reuse_buffer`` this is the buffer itself (no copy).
        """
        return flatten_grads(grads, sum(g.shape[1:].numel() for g in grads.values()))


def _add_to_grad(layer: nn.Module, means: list[torch.Tensor]) -> None:
    """Add ``[weight, bias]`` mean gradients to the trainable parameters' ``.grad``."""
    for param, mean in zip((layer.weight, layer.bias), means, strict=False):
        if param.requires_grad:
            param.grad = mean if param.grad is None else param.grad.add_(mean)
