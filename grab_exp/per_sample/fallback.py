"""Per-layer fallback, like opacus's functorch one: a layer without a rule is replayed alone on
each example's slice of its saved inputs, and the gradient of ``sum_k <g_k, out_k>`` (``g_k``: the
summed loss's gradient at output ``k``) is that example's; under ``vmap``, else (RNNs) a loop."""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch
from torch import nn
from torch.func import functional_call, grad, vmap
from torch.utils._pytree import tree_flatten, tree_unflatten

from grab_exp.per_sample.check.state import drew_since, generator_states
from grab_exp.per_sample.func import split_state
from grab_exp.per_sample.layout import Call, CallLayout
from grab_exp.per_sample.modules import UnsupportedModelError
from grab_exp.per_sample.rules.base import Outs

__all__ = ["FuncFallback"]


class FuncFallback:
    """Per-sample gradients of ``layer``'s own parameters, then the ``adopted`` ones (of
    submodules its forward uses without calling them), as ``names``, by ``vmap`` or a loop;
    ``label``: the layer's, for a refusal."""

    def __init__(self, layer: nn.Module, adopted: Iterable[str] = (), label: str = "") -> None:
        self.layer, self.adopted, self.label = layer, list(adopted), label
        self.names = [n for n, _ in layer.named_parameters(recurse=False)] + self.adopted
        # torch's vmap has no batching rule for the fused RNN kernels: it runs them one example
        # at a time through its slow fallback, or fails (nn.GRU), so a plain loop it is
        self.batched_by = "loop" if isinstance(layer, nn.RNNBase) else "vmap"
        self.modules = list(layer.named_modules())  # any may draw random numbers (dropout)

    def per_sample(
        self, call: Call, layout: CallLayout, batch: int, out: Outs
    ) -> list[torch.Tensor | None]:
        """``[(B, *p.shape)]`` of ``call`` per name (``None``: frozen), into ``out`` if given."""
        own, fixed = split_state(self.layer, self.names, copy_buffers=True)
        fixed.update((n, b.clone()) for n, b in call.buffers.items())  # as the call found them
        used = [k for k, g in enumerate(call.grads) if g is not None]
        grads_sum = [call.grads[k] * batch for k in used]  # of the summed loss
        outs = dict(zip(self.names, out, strict=True))
        try:
            grads = self._rows(own, fixed, call, layout, used, grads_sum, batch, outs)
        except (RuntimeError, NotImplementedError) as error:
            if "randomness" in str(error):  # vmap's, or the loop's: a replay draws anew
                raise UnsupportedModelError(
                    f"{self.label}: its forward draws random numbers itself (torch.randn_like, "
                    "F.dropout: no Dropout module), which a replay per example cannot draw as "
                    "the batch did; use method=func with randomness='different' (auto does)"
                ) from error
            if self.batched_by == "loop":
                raise
            self.batched_by = "loop"  # torch's vmap cannot batch this layer
            grads = self._rows(own, fixed, call, layout, used, grads_sum, batch, outs)
        pairs = zip((grads.get(n) for n in self.names), out, strict=True)
        return [g if g is None or o is None or g is o else o.copy_(g) for g, o in pairs]

    def _rows(self, own, fixed, call, layout, used, grads_sum, batch, outs) -> dict:
        """``grad`` of one example's ``sum_k <g_k, out_k>``, by ``vmap`` or a loop (into outs)."""
        batched = [k for k, d in enumerate(layout.inputs) if d is not None]
        in_dims, out_dims = [layout.inputs[k] for k in batched], [layout.outputs[k] for k in used]

        def one_example(own_i, inputs_i, grads_i):
            leaves = list(call.leaves)
            for k, leaf, d in zip(batched, inputs_i, in_dims, strict=True):
                leaves[k] = leaf.unsqueeze(d)
            args, kwargs = tree_unflatten(leaves, call.spec)
            outputs = tree_flatten(functional_call(self.layer, (own_i, fixed), tuple(args), kwargs))
            pairs = zip(used, grads_i, out_dims, strict=True)
            return sum((outputs[0][k] * g.unsqueeze(d)).sum() for k, g, d in pairs)

        inputs = [call.leaves[k] for k in batched]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # RNNs: weights not one chunk
            if self.batched_by == "vmap":
                per_example = vmap(grad(one_example), (None, in_dims, out_dims), randomness="error")
                return per_example(own, inputs, grads_sum)
            rows: dict[str, list[torch.Tensor]] = {n: [] for n in own}
            drawn = generator_states()  # the replays may draw nothing (forked by the caller)
            for b in range(batch):  # plain autograd: a checkpoint inside the layer runs too
                for n, buffer in call.buffers.items():  # each example from the call's buffers
                    fixed[n].copy_(buffer)
                params = {n: p.detach().requires_grad_(True) for n, p in own.items()}
                with torch.enable_grad():
                    inputs_b = [t.select(d, b) for t, d in zip(inputs, in_dims, strict=True)]
                    grads_b = [g.select(d, b) for g, d in zip(grads_sum, out_dims, strict=True)]
                    total = one_example(params, inputs_b, grads_b)  # () or 0: no output used
                    unused = not isinstance(total, torch.Tensor) or total.grad_fn is None
                    grads = (
                        [None] * len(params)
                        if unused
                        else torch.autograd.grad(total, list(params.values()), allow_unused=True)
                    )
                for (n, p), g in zip(params.items(), grads, strict=True):
                    rows[n].append(torch.zeros_like(p) if g is None else g)
            if drew_since(drawn):
                raise RuntimeError("the layer's replay draws random numbers (randomness)")
        return {n: torch.stack(r, out=outs.get(n)) for n, r in rows.items()}
