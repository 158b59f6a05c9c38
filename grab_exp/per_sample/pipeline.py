"""Gradient pipelines: how one training step turns a batch into gradients, and
:func:`make_per_sample`, the factory of the per-sample paths."""

from __future__ import annotations

from functools import partial
from typing import ClassVar

import torch
from torch import nn
from torch.nn.parameter import is_lazy

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.auto import AutoPerSample
from grab_exp.per_sample.base import LossFn, PerSampleGradients, one_line
from grab_exp.per_sample.check.schedule import CHECK_EVERY
from grab_exp.per_sample.compiled import check_compile_method, compile_step
from grab_exp.per_sample.func import FuncPerSample
from grab_exp.per_sample.hooks import FactoredPerSample, HookedPerSample, check_supported
from grab_exp.per_sample.loop import LoopPerSample
from grab_exp.per_sample.modules import UnsupportedModelError
from grab_exp.per_sample.rules import rule_for
from grab_exp.validation import check_choice


class ClassicPipeline:
    """Plain ``loss.backward()`` on the batch mean (no per-sample gradients); ``compile_mode``:
    ``None`` (eager) or a ``torch.compile`` mode (:mod:`grab_exp.per_sample.compiled`)."""

    provides_per_sample: ClassVar[bool] = False

    def __init__(self, model: nn.Module, loss_fn: LossFn, compile_mode: str | None = None) -> None:
        self.model, self.loss_fn, self.compile_mode = model, loss_fn, compile_mode
        self._forward_loss = None
        if compile_mode is not None:  # the forward and the loss as one graph (its backward too)
            self._forward_loss = compile_step(lambda x, y: loss_fn(model(x), y), compile_mode)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, None]:
        """Add the batch's mean gradient to ``param.grad``; ``(detached loss, None)``."""
        loss = self._forward_loss(x, y) if self._forward_loss else self.loss_fn(self.model(x), y)
        loss.backward()
        return loss.detach(), None

    def state_bytes(self) -> int:
        return 0


class PerSamplePipeline:
    """``pipeline=functional``: :func:`make_per_sample` as a Hydra target (``reuse_buffer`` on:
    the ordering takes the buffer without a copy)."""

    provides_per_sample: ClassVar[bool] = True

    def __init__(
        self,
        model: nn.Module,
        loss_fn: LossFn,
        chunk_size: int | None = None,
        method: str = "auto",
        compile_mode: str | None = None,
        reuse_buffer: bool = True,
        factors: bool = True,
        check_every: int = CHECK_EVERY,
    ) -> None:
        options = {"compile_mode": compile_mode, "chunk_size": chunk_size, "factors": factors}
        options |= {"reuse_buffer": reuse_buffer, "check_every": check_every}
        self.per_sample = make_per_sample(model, loss_fn, method, **options)

    @property
    def method(self) -> str:
        """The method in use (``auto`` resolved; it may change when a call refuses the model)."""
        return self.per_sample.method

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, BatchGrads]:
        return self.per_sample(x, y)

    def state_bytes(self) -> int:
        return self.per_sample.state_bytes()


#: ``method`` -> its class (``auto`` is resolved by :func:`resolve_method`)
PER_SAMPLE_CLASSES: dict[str, type[PerSampleGradients]] = {
    cls.method: cls for cls in (FuncPerSample, HookedPerSample, FactoredPerSample, LoopPerSample)
}
METHODS = (*PER_SAMPLE_CLASSES, "auto")


def resolve_method(
    model: nn.Module,
    method: str,
    compile_mode: str | None = None,
    factors: bool = True,
    reuse_buffer: bool = False,
) -> str:
    """What ``method`` means for ``model``, the one place ``auto`` is resolved (to its first path:
    ``func`` under compile or without the hook path, else :func:`auto_hooks_method`'s);
    ``ValueError``: an unknown ``method``, or one that cannot be compiled."""
    check_choice("pipeline.method", method, METHODS)
    if compile_mode is not None:
        check_compile_method(method)
        return "func"
    if method != "auto":
        return method
    method = auto_hooks_method(model, reuse_buffer) if hooks_supported(model) else "func"
    return "hooks" if method == "factored" and not factors else method


def make_per_sample(
    model: nn.Module,
    loss_fn: LossFn,
    method: str = "auto",
    *,
    factors: bool = True,
    compile_mode: str | None = None,
    chunk_size: int | None = None,
    randomness: str | None = None,
    reuse_buffer: bool = False,
    check_every: int = CHECK_EVERY,
) -> PerSampleGradients:
    """Per-sample gradients of ``model`` by ``method`` name (like opacus's ``wrap_model``):
    ``func``, ``hooks``, ``factored``, ``loop`` or ``auto`` (:func:`resolve_method`, then ``func``
    and ``loop`` when a call refuses the model; under ``compile_mode``, ``func`` compiled);
    ``chunk_size`` and ``randomness`` are ``func``'s (``auto``: ``"different"``, for a model
    that draws random numbers), ``reuse_buffer`` the hook path's."""
    requested, method = method, resolve_method(model, method, compile_mode, factors, reuse_buffer)
    if requested == "auto" and randomness is None:
        randomness = "different"  # for func only: the hook path takes the batch's own draws
    options = {"chunk_size": chunk_size, "randomness": randomness, "check_every": check_every}
    make_func = partial(FuncPerSample, model, loss_fn, compile_mode=compile_mode, **options)
    make_loop = partial(LoopPerSample, model, loss_fn, check_every=check_every)
    hook_options = {"reuse_buffer": reuse_buffer, "check_every": check_every}
    make_hooked = partial(PER_SAMPLE_CLASSES[method], model, loss_fn, **hook_options)
    if requested == "auto" and compile_mode is None:  # AutoPerSample: then func, then loop
        paths = [("func", make_func), ("loop", make_loop)]
        if method == "func":  # the structure rules the hook path out
            return AutoPerSample(paths, [f"method=hooks: {hooks_refusal(model)}"])
        return AutoPerSample([(method, make_hooked), *paths])
    if method == "func":
        return make_func()
    if randomness is not None and requested != "auto":
        raise ValueError(f"randomness={randomness!r} needs method=func or auto; got {method!r}")
    return make_loop() if method == "loop" else make_hooked()


#: with a reused buffer, ``auto`` factors when the layers without a factor form hold at most this
#: share of the weights (else the buffer's one matrix, which an ordering reads without a copy)
MATERIALIZED_SHARE = 0.125


def auto_hooks_method(model: nn.Module, reuse_buffer: bool = False) -> str:
    """``factored`` where a layer has a factor rule (its factors are kept only where they pay),
    with ``reuse_buffer`` only where those hold most weights (:data:`MATERIALIZED_SHARE`)."""
    total = materialized = 0
    for module in model.modules():
        params = module.parameters(recurse=False)  # a lazy one has no size yet: not counted
        count = sum(p.numel() for p in params if p.requires_grad and not is_lazy(p))
        total += count
        materialized += 0 if getattr(rule_for(module), "has_factors", False) else count
    factors = materialized <= MATERIALIZED_SHARE * total if reuse_buffer else materialized < total
    return "factored" if factors else "hooks"


def hooks_supported(model: nn.Module) -> bool:
    """Whether ``method=auto`` picks the hook path for ``model`` (:func:`hooks_refusal`)."""
    return hooks_refusal(model) is None


def hooks_refusal(model: nn.Module) -> str | None:
    """Why ``method=auto`` does not pick the hook path for ``model`` (``None``: it does)."""
    root = "the root module owns trainable parameters (func replays the whole model in one pass)"
    if any(p.requires_grad for p in model.parameters(recurse=False)):
        return root
    try:
        check_supported(model)
    except UnsupportedModelError as error:
        return one_line(error)
    # a module with parameters and no forward: its parent's replay differentiates them
    for name, m in model.named_modules():
        trainable = any(p.requires_grad for p in m.parameters(recurse=False))
        if trainable and type(m).forward is nn.Module.forward:
            return f"{name or '<root>'} ({type(m).__name__}) has parameters and no forward"
    return None
