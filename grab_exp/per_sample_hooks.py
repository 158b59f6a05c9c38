"""Per-sample gradients from one ordinary backward, with per-layer hooks.

For ``nn.Linear`` and ``nn.Conv2d`` the gradient of one example's loss with respect to the
layer's weight is an outer product (Linear) or a correlation (Conv2d) of the layer's input and the
gradient at its output, both of which an ordinary backward pass already has. Forward hooks keep
each layer's input, tensor hooks catch the output gradient, and a batched matmul (Linear) or one
grouped convolution (Conv2d) forms the ``(B, *weight.shape)`` per-sample gradients. The same
backward fills ``param.grad`` with the mean gradient, so the optimizer needs nothing else.

Models with any other trainable layer are rejected (``UnsupportedModelError``); the
``torch.func`` path in :mod:`grab_exp.per_sample` covers them.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F

from grab_exp.per_sample import PerSampleGradients

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
    """Raise ``UnsupportedModelError`` naming the first layer the hooks cannot handle."""
    for name, module in model.named_modules():
        own = [p for p in module.parameters(recurse=False) if p.requires_grad]
        reason = _unsupported_reason(module) if own else None
        if reason is not None:
            raise UnsupportedModelError(
                f"{name or '<root>'} ({reason}): the hook path supports Linear and Conv2d; "
                "use method=func"
            )


def _linear_grads(layer: nn.Linear, a: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    """Per-sample ``[weight, bias]`` grads from ``a (B, *, in)`` and out-grad ``g (B, *, out)``."""
    a3 = a.reshape(a.shape[0], -1, a.shape[-1])  # (B, T, in)
    g3 = g.reshape(g.shape[0], -1, g.shape[-1])  # (B, T, out)
    grads = [torch.bmm(g3.transpose(1, 2), a3)]  # (B, out, in)
    if layer.bias is not None:
        grads.append(g3.sum(dim=1))  # (B, out)
    return grads


def _conv2d_grads(layer: nn.Conv2d, a: torch.Tensor, g: torch.Tensor) -> list[torch.Tensor]:
    """Per-sample ``[weight, bias]`` grads from input ``a (B, C, H, W)``, ``g (B, O, H', W')``.

    ``dW[b, o, c, i, j] = sum_pq g[b, o, p, q] a[b, c, p*stride + i*dilation, ...]`` is itself a
    convolution: channels become the batch, every example's output gradient becomes a group's
    kernel, and stride and dilation swap roles. One grouped convolution is faster here than
    ``unfold`` + ``bmm`` and never materializes the ``(B, C*kh*kw, L)`` patches.
    """
    batch, out_channels = g.shape[:2]
    kh, kw = layer.weight.shape[2:]
    weight = F.conv2d(
        a.transpose(0, 1),  # (C, B, H, W): channels as the batch
        g.reshape(batch * out_channels, 1, *g.shape[2:]),  # (B*O, 1, H', W'): one group per b
        padding=layer.padding,
        stride=layer.dilation,
        dilation=layer.stride,
        groups=batch,
    )[..., :kh, :kw]  # (C, B*O, kh, kw); padding arithmetic can leave extra rows to crop
    weight = weight.reshape(-1, batch, out_channels, kh, kw).permute(1, 2, 0, 3, 4)
    grads = [weight]  # (B, O, C, kh, kw)
    if layer.bias is not None:
        grads.append(g.sum(dim=(2, 3)))  # (B, O)
    return grads


class HookedPerSampleGradients:
    """Per-sample gradients of Linear/Conv2d models from one ordinary backward.

    Args:
        model: a model whose trainable layers are all ``nn.Linear`` / ``nn.Conv2d``.
        loss_fn: ``loss_fn(logits, y)`` returning the batch MEAN of per-example losses (the
            default reduction of torch's losses).

    Calling it runs forward + backward: ``param.grad`` receives the mean gradient (added to
    what is there, like ``loss.backward()``) and the per-sample gradients come back.
    """

    def __init__(self, model: nn.Module, loss_fn: Callable) -> None:
        PerSampleGradients(model, loss_fn).check()  # BatchNorm / Dropout errors, same wording
        check_supported(model)
        self.model, self.loss_fn = model, loss_fn
        self._layers = {
            name: m
            for name, m in model.named_modules()
            if isinstance(m, (nn.Linear, nn.Conv2d))
            and any(p.requires_grad for p in m.parameters(recurse=False))
        }
        self._inputs: dict[str, torch.Tensor] = {}
        self._out_grads: dict[str, torch.Tensor] = {}
        for name, layer in self._layers.items():
            layer.register_forward_hook(self._forward_hook(name))

    def _forward_hook(self, name: str):
        def hook(module: nn.Module, inputs: tuple[torch.Tensor, ...], output: torch.Tensor):
            if not torch.is_grad_enabled():
                return
            self._inputs[name] = inputs[0].detach()
            output.register_hook(lambda grad: self._out_grads.__setitem__(name, grad))

        return hook

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, Grads]:
        """Forward and backward on ``x (B, ...)``, ``y (B,)``.

        Returns:
            ``(loss, grads)``: the detached mean loss ``()`` and name -> ``(B, *param.shape)``
            in ``named_parameters`` order.
        """
        loss = self.loss_fn(self.model(x), y)
        loss.backward()
        batch = x.shape[0]
        per_layer: Grads = {}
        for name, layer in self._layers.items():
            builder = _linear_grads if isinstance(layer, nn.Linear) else _conv2d_grads
            # the mean loss's output gradients carry a factor 1/B
            grads = builder(layer, self._inputs[name], self._out_grads[name] * batch)
            names = [f"{name}.weight"] + ([f"{name}.bias"] if layer.bias is not None else [])
            per_layer.update(zip(names, grads, strict=True))
        self._inputs.clear()
        self._out_grads.clear()
        ordered = {n: per_layer[n] for n, p in self.model.named_parameters() if p.requires_grad}
        return loss.detach(), ordered

    def accumulate_mean(self, grads: Grads) -> None:
        """No-op: the backward in ``__call__`` already added the mean gradient to ``.grad``."""

    @staticmethod
    def flat(grads: Grads) -> torch.Tensor:
        """``(B, d)`` matrix of the per-sample gradients, columns in ``named_parameters`` order."""
        return torch.cat([g.flatten(start_dim=1) for g in grads.values()], dim=1)
