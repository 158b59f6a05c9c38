"""The loss contract: ``loss_fn(out, y)`` is the batch MEAN of the examples' own losses."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._pytree import tree_flatten, tree_unflatten

from grab_exp.devices import host_reads_allowed
from grab_exp.losses import CrossEntropy, TokenCrossEntropy
from grab_exp.per_sample.check.rounding import ALLOWANCE, loss_rounding
from grab_exp.per_sample.check.state import drew_since, generator_states, random_modules_off
from grab_exp.per_sample.check.tolerance import LOSS_TOLERANCE, tolerance
from grab_exp.per_sample.layout import OutputLayout, batch_size, moved, take
from grab_exp.per_sample.modules import LossContractError

#: the loss contract, in the words every loss refusal ends with
CONTRACT = (
    "per-sample gradients need loss_fn(out, y) to be the batch MEAN of per-example losses "
    "(reduction='mean', no class weight= and no ignore_index padding; weight each example "
    "yourself, e.g. (w[y] * F.cross_entropy(out, y, reduction='none')).mean()); see "
    "docs/which-models-work.md"
)


def loss_of(loss_fn: Any, out: Any, y: torch.Tensor) -> torch.Tensor:
    """``loss_fn(out, y)``, refused (:class:`.LossContractError`) unless a scalar that left
    ``out`` as it was (else the output's gradient and the checks read other numbers)."""
    tensors = [out] if isinstance(out, torch.Tensor) else tree_flatten(out)[0]  # usual: one
    versions = [(t, t._version) for t in tensors if isinstance(t, torch.Tensor)]
    loss = loss_fn(out, y)
    if moved(versions):
        raise LossContractError(
            "loss_fn changed the model's output in place (an in-place clamp_, sub_ or mul_ on "
            "it): per-sample gradients need a loss that leaves its input as it is; use the "
            "out-of-place operation (out.clamp(...), not out.clamp_(...))"
        )
    check_scalar(loss)
    return loss


def check_scalar(loss: torch.Tensor) -> None:
    if not isinstance(loss, torch.Tensor) or loss.dim() != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise LossContractError(f"loss_fn returned {shape}, not a scalar: {CONTRACT}")


def example_losses(loss_fn, out: Any, y: torch.Tensor, layout: OutputLayout) -> torch.Tensor:
    """Each example's own loss ``(B,)``, ``loss_fn`` of its slice of ``out`` (in its graph)."""
    parts = (slice(i, i + 1) for i in range(batch_size(y)))
    return torch.stack([loss_fn(layout.narrow(out, p.start, 1), take(y, p)) for p in parts])


def known_mean(loss_fn: Any, out: Any, y: Any, layout: OutputLayout) -> bool:
    """Whether ``loss_fn`` is a cross-entropy or squared error of torch's or this project's
    (:data:`MEAN_LOSSES`) that is the batch mean of per-example losses by construction on these
    ``out`` and ``y``: one output tensor, its batch in dimension 0; the mean reduction, no class
    weight, no hook; targets paired with the outputs element by element, none at its
    ``ignore_index`` (read on the host, so never on CUDA). Such a loss's split has nothing to
    find; a subclass of theirs, or any other loss, is split."""
    kind = next((k for known, k in MEAN_LOSSES if loss_fn is known or type(loss_fn) is known), None)
    if kind is None or not (torch.is_tensor(out) and torch.is_tensor(y)) or layout.dims != (0,):
        return False
    if isinstance(loss_fn, nn.Module) and (
        (loss_fn.reduction, getattr(loss_fn, "weight", None)) != ("mean", None)
        or loss_fn._forward_hooks
        or loss_fn._forward_pre_hooks
    ):
        return False
    if not host_reads_allowed(y.device) or out.dim() < 2 - (kind == "squared"):
        return False
    if kind == "squared" or y.is_floating_point():  # class probabilities: the outputs' shape
        return out.shape == y.shape and kind != "tokens"
    pairs = out.shape[:1] + out.shape[2:] if kind == "classes" else out.shape[:-1]
    return y.shape == pairs and not bool((y == getattr(loss_fn, "ignore_index", -100)).any())


#: :func:`known_mean`'s losses, a function or an exact type, and how their targets pair with the
#: outputs: ``classes`` (``(B, C, ...)`` and ``(B, ...)``), ``tokens`` (``(B, T, V)``, flattened,
#: and ``(B, T)``) or ``squared`` (alike shapes)
MEAN_LOSSES: tuple[tuple[Any, str], ...] = (
    (F.cross_entropy, "classes"),
    (F.mse_loss, "squared"),
    (nn.CrossEntropyLoss, "classes"),
    (nn.MSELoss, "squared"),
    (CrossEntropy, "classes"),
    (TokenCrossEntropy, "tokens"),
)


class OutputSplit:
    """The loss contract on a split of the batch, at the output: a mean's gradient at the outputs
    of its first ``k`` examples is ``k / B`` times that of their own loss (a sum, or a class
    ``weight=`` or ``ignore_index`` padding averaged over the batch, weighs them otherwise, even
    where the parts' losses are alike). The gradient the loss sends each output leaf itself: the
    part's own loss on a detached copy of its outputs, and the batch's read by a hook on the
    output in its own backward where the output is one leaf (else on copies too: a leaf computed
    from another gets gradient through it), all differentiated at the copies alone (nothing
    reaches the parameters, the targets or a temperature the loss learns)."""

    def __init__(self, loss_fn, out: Any, y: torch.Tensor, layout: OutputLayout, k: int) -> None:
        leaves, spec, batched = graded_leaves(out, layout)
        dims = layout.dims
        wholes, parts = list(leaves), list(leaves)
        for i in batched:  # (B, ...) and (k, ...) each: leaves of graphs of their own
            wholes[i] = leaves[i].detach().requires_grad_()
            parts[i] = leaves[i].detach().narrow(dims[i], 0, k).requires_grad_()
        self.k, self.scale, self.dims = k, batch_size(y) / k, [dims[i] for i in batched]
        self.parts, self.wholes = [parts[i] for i in batched], [wholes[i] for i in batched]
        self.dtype = max((leaves[i].dtype for i in batched), default=None, key=_eps)
        self.grads, self.whole, self.handles = [None], None, []
        self._rounding = (loss_fn, parts, spec, batched, take(y, slice(0, k)))  # where it fails
        with torch.enable_grad():
            self.part = loss_fn(tree_unflatten(parts, spec), self._rounding[-1])
            if len(batched) == 1:  # its gradient in the batch's backward is the loss's own
                self.handles = [leaves[batched[0]].register_hook(self._keep)]
                self.wholes = []
            elif batched:
                self.whole = loss_fn(tree_unflatten(wholes, spec), y)

    def _keep(self, grad: torch.Tensor) -> None:
        self.grads = [grad]

    def gap(self, loss: torch.Tensor):
        """After the batch's backward: the gap relative (NaN where the part's loss is not
        finite, 0 where the batch's is not), a float on the CPU, else a ``()`` tensor; ``None``
        where the loss reaches no batched leaf of the output."""
        for handle in self.handles:
            handle.remove()
        whole = self.whole
        graded = self.part.requires_grad and (
            loss.requires_grad if whole is None else whole.requires_grad
        )
        if not self.parts or not graded:
            return None
        total = self.part if whole is None else whole + self.part
        grads = torch.autograd.grad(total, self.parts + self.wholes, allow_unused=True)
        wholes = self.grads if whole is None else grads[len(self.parts) :]
        differences, sizes = [], []
        for g, h, part, d in zip(wholes, grads, self.parts, self.dims, strict=False):
            if h is None:  # the part's own, ours to write: not expanded, not another leaf's
                h = torch.zeros_like(part)
            elif len(self.parts) > 1 or not h.is_contiguous():
                h = h.clone(memory_format=torch.contiguous_format)
            sizes.append(torch.linalg.vector_norm(h))
            if g is not None:  # less the batch's, in place (an LM's logits: no copy)
                h.sub_(g.narrow(d, 0, self.k), alpha=self.scale)
            differences.append(torch.linalg.vector_norm(h))
        difference, size = (
            v[0] if len(v) == 1 else torch.stack(v).norm() for v in (differences, sizes)
        )
        if host_reads_allowed(loss.device):  # reads, then floats
            if not math.isfinite(loss.item()):
                return 0.0  # a diverged step: the runner's to stop on
            value = self.part.item()
            gap = difference.item() / max(size.item(), 1e-30) + (value - value)  # NaN: part's
            if gap > tolerance(LOSS_TOLERANCE, self.dtype):  # cancelling to within rounding?
                gap = 0.0 if gap <= ALLOWANCE * loss_rounding(*self._rounding) else gap
            return gap
        gap = difference / size.clamp_min(1e-30) + (self.part - self.part).detach()
        return gap.where(loss.detach().isfinite(), 0.0)


def output_rounding(loss_fn, out: Any, y: torch.Tensor, layout: OutputLayout) -> float:
    """:func:`.rounding.loss_rounding` of ``loss_fn`` at the batched leaves of ``out``: how far
    the gradient the loss sends each example's output is from float64's (relative)."""
    leaves, spec, batched = graded_leaves(out, layout)
    return loss_rounding(loss_fn, leaves, spec, batched, y) if batched else 0.0


def graded_leaves(out: Any, layout: OutputLayout) -> tuple[list, Any, list[int]]:
    """``out``'s leaves, its pytree spec and the indices of the leaves with a batch dimension
    that carry a gradient (the floating ones in the graph): what the loss split compares."""
    leaves, spec = tree_flatten(out)
    return (
        leaves,
        spec,
        [i for i, t in enumerate(leaves) if layout.dims[i] is not None and _graded(t)],
    )


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _graded(t: Any) -> bool:
    return torch.is_tensor(t) and t.is_floating_point() and t.requires_grad


def forwards_gap(forward, loss_fn, x: Any, y: torch.Tensor, loss: torch.Tensor, k: int, model):
    """The loss split of an output with a value of the whole batch (HuggingFace's ``loss`` from
    ``labels`` among the inputs, which every slice of the output repeats), by the values: the
    :func:`relative_gap` of ``B * loss`` and ``k * first + (B - k) * second``, ``loss_fn`` of a
    ``forward`` of each part's own inputs, the modules that draw random numbers in eval mode and
    then the batch forwarded again too; ``None`` where the forwards still drew (noise outside
    such modules: nothing to compare)."""
    batch = batch_size(y)
    with torch.no_grad(), random_modules_off(model) as drawing:
        start, parts = generator_states(), (slice(0, k), slice(k, batch))
        first, second = (loss_fn(forward(take(x, p)), take(y, p)) for p in parts)
        loss = loss_fn(forward(x), y) if drawing else loss
        if drew_since(start):
            return None
    if host_reads_allowed(loss.device):  # three reads, then floats
        first, second, loss = first.item(), second.item(), loss.item()
    size = abs(first) * k + abs(second) * (batch - k)
    return relative_gap(loss * batch, first * k + second * (batch - k), size)


def relative_gap(got, want, size):
    """``|got - want| / size`` of ``()`` tensors or floats: a float where host reads are free (the
    CPU), else a ``()`` tensor; ``None`` (or 0) when ``got``, the batch loss, is not finite."""
    if isinstance(got, torch.Tensor) and not host_reads_allowed(got.device):
        gap = (got - want).abs() / size.clamp_min(1e-30)
        return torch.where(got.isfinite(), gap, torch.zeros_like(gap))
    got, want, size = float(got), float(want), float(size)
    if not math.isfinite(got):  # a diverged step: the runner's to stop
        return None
    return abs(got - want) / max(size, 1e-30)


def loss_problem(loss: torch.Tensor, losses: torch.Tensor) -> str | None:
    """Why ``loss`` is not the mean of the examples' own ``losses (B,)`` (``None``: it is)."""
    if len(losses) < 2:
        return None
    mean, total = losses.mean().detach(), losses.sum().detach()
    limit = tolerance(LOSS_TOLERANCE, losses.dtype)
    size = losses.detach().abs().mean()  # not |mean|: the examples' terms may cancel
    if bool((loss - mean).abs() <= limit * size + 1e-12):
        return None
    if not torch.isfinite(losses).all():
        found = "some examples' own losses are not finite (an example that is all padding?)"
    elif bool((loss - total).abs() <= limit * total.abs().clamp_min(1e-12) + 1e-12):
        found = "it is their SUM"
    else:
        found = "neither their mean nor their sum"
    return (
        f"loss_fn gave {loss.item():.6g} for {len(losses)} examples whose own losses average "
        f"{mean.item():.6g} ({found}): {CONTRACT}"
    )


def refuse_gap(gap: float, dtype: torch.dtype) -> None:
    if not gap <= tolerance(LOSS_TOLERANCE, dtype):  # NaN too
        raise LossContractError(
            f"loss_fn of this batch is not the mean of its two parts' losses (relative gap "
            f"{gap:.2g}, of their values or of their gradients at the output): {CONTRACT}"
        )
