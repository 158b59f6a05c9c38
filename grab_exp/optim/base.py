"""Shared machinery of the VRGD optimizers: GSNR input, the step skeleton, the clip counters.

Every step of a :class:`GSNROptimizer` needs the GSNR of that step's batch. The API is two
calls per step, in this order, after ``param.grad`` holds the mean gradient ``ḡ``::

    optimizer.zero_grad(set_to_none=True)
    loss, grads = pipeline(x, y)    # p.grad = ḡ; grads: name -> (B, *shape)
    optimizer.observe(grads)        # GSNR ratios for the next step (no host sync)
    optimizer.step()                # consumes them; raises if observe() was not called

and once per epoch ``optimizer.clip_fractions()`` (one host read) returns and resets
``{"gsnr/clip_low": ..., "gsnr/clip_high": ...}``. ``set_gsnr(stats)`` takes ratios computed
elsewhere (e.g. by :func:`~grab_exp.optim.gsnr.gsnr_ratios` on a ``(B, d)`` matrix).

Per-sample gradients are matched to the optimizer's parameters **by position**: the trainable
parameters (``requires_grad``) in param-group order, which is ``named_parameters()`` order when
the optimizer is built from ``model.parameters()`` (as the runner does) - the order of the dict
``torch.func`` returns. Sizes are checked, so a mismatch is a ``ValueError``, not a silent
misassignment.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from grab_exp.optim.gsnr import GSNRStats, PerSample, gsnr_ratios
from grab_exp.optim.settings import check_batch_sizes, check_gsnr_settings
from grab_exp.validation import check_positive

__all__ = ["CLIP_HIGH", "CLIP_LOW", "GSNROptimizer", "device_step"]

CLIP_LOW = "gsnr/clip_low"
CLIP_HIGH = "gsnr/clip_high"

#: a param group, and one tensor per parameter of it (its params, their grads or ratios)
Group = dict[str, Any]
Tensors = list[torch.Tensor]
Lists = tuple[Tensors, Tensors, Tensors]


def device_step(count: int | float | torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """An optimizer's step count as a ``()`` tensor on ``param``'s device, as a captured step
    needs (from an int of an older checkpoint, or a CPU tensor of one loaded with
    ``map_location="cpu"``). float32 as torch's capturable optimizers keep it, float64 for
    float64 parameters or under a float64 default.

    A number or a host tensor becomes a fill on the device, never a host-to-device copy: on
    CUDA that copy is pageable and blocks the host (sync-debug mode refuses it in a step)."""
    wide = torch.float64 in (param.dtype, torch.get_default_dtype())
    dtype = torch.float64 if wide else torch.float32
    if torch.is_tensor(count) and count.device.type != "cpu":
        return count.to(device=param.device, dtype=dtype)
    value = count.item() if torch.is_tensor(count) else count  # a host value: no device sync
    return torch.full((), value, dtype=dtype, device=param.device)


class GSNROptimizer(torch.optim.Optimizer):
    """Base class: subclasses implement ``_update(group, params, grads, ratios)``.

    ``gamma``, ``groups`` and ``eps`` (see :func:`~grab_exp.optim.gsnr.gsnr_ratios`) are kept in
    ``defaults`` (so they are in ``state_dict()``); the GSNR is computed over all parameters at
    once with these values.

    Args:
        params: Parameters or param groups, as for any ``torch.optim.Optimizer``.
        defaults: The subclass's per-group defaults (must hold ``lr``).
        gamma: Lower clip of the scaled GSNR, in ``(0, 1]``.
        groups: Number of groups ``k`` >= 2, or ``None`` for one example per group.
        eps: Relative variance regularizer, > 0.

    Raises:
        ValueError: One line naming the bad setting (``optimizer.lr``, ``optimizer.gamma``...).
    """

    def __init__(
        self,
        params: Any,
        defaults: dict[str, Any],
        *,
        gamma: float,
        groups: int | None,
        eps: float,
    ) -> None:
        check_positive("optimizer.lr", defaults["lr"])
        check_gsnr_settings(gamma, groups, eps)
        super().__init__(params, {**defaults, "gamma": gamma, "groups": groups, "eps": eps})
        self._reset_runtime()

    def _reset_runtime(self) -> None:
        self._pending: dict[int, torch.Tensor] | None = None  # id(param) -> ratio (*shape)
        # (3,) int64 on the device: clipped low, clipped high, elements; made at the first
        # observe and updated in place (a captured step holds it)
        self._clip_counts: torch.Tensor | None = None

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)  # also called by load_state_dict: keep what is there
        if not hasattr(self, "_clip_counts"):  # unpickled or deep-copied
            self._reset_runtime()

    def trainable_params(self) -> list[torch.Tensor]:
        """Parameters that per-sample gradients are matched to, in order."""
        return [p for group in self.param_groups for p in group["params"] if p.requires_grad]

    def check_batches(self, batch_size: int, num_examples: int) -> None:
        """Raise a one-line ``ValueError`` (``optimizer.groups``) if some batch of an epoch of
        ``num_examples`` in batches of ``batch_size`` cannot be split into the GSNR groups."""
        check_batch_sizes(self.defaults["groups"], batch_size, num_examples)

    def observe(self, per_sample: PerSample) -> GSNRStats:
        """Compute this step's GSNR from per-sample gradients and keep it for ``step()``.

        Args:
            per_sample: A :class:`~grab_exp.grads.batch.BatchGrads`, dict name ->
                ``# (B, *shape)`` or sequence of ``# (B, *shape)``, one per
                trainable parameter in order, or a ``(B, d)`` matrix of them concatenated.

        Returns:
            The :class:`~grab_exp.optim.gsnr.GSNRStats` (device tensors; nothing is synced).
        """
        sizes = None
        if isinstance(per_sample, torch.Tensor):
            sizes = [p.numel() for p in self.trainable_params()]
        stats = gsnr_ratios(
            per_sample,
            groups=self.defaults["groups"],
            gamma=self.defaults["gamma"],
            eps=self.defaults["eps"],
            sizes=sizes,
        )
        self.set_gsnr(stats)
        return stats

    def set_gsnr(self, stats: GSNRStats) -> None:
        """Use ``stats.ratios`` (one per trainable parameter, in order) for the next step.

        Also adds the step's clip counts to the epoch's counters.

        Raises:
            ValueError: The ratios do not match the trainable parameters in number or size.
        """
        params = self.trainable_params()
        if len(stats.ratios) != len(params):
            raise ValueError(
                f"GSNR ratios for {len(stats.ratios)} tensors, but the optimizer has "
                f"{len(params)} trainable parameters"
            )
        pending = {}
        for i, (p, r) in enumerate(zip(params, stats.ratios, strict=True)):
            if r.numel() != p.numel():
                raise ValueError(
                    f"GSNR ratio {i} has {r.numel()} elements, trainable parameter {i} has shape "
                    f"{tuple(p.shape)}: pass per-sample gradients in parameter order"
                )
            pending[id(p)] = r.view(p.shape).to(p.dtype)
        self._pending = pending
        if self._clip_counts is None:
            self._clip_counts = torch.zeros(3, dtype=torch.long, device=stats.clip_low.device)
        low, high, elements = self._clip_counts.unbind()
        low.add_(stats.clip_low)
        high.add_(stats.clip_high)
        elements.add_(stats.numel)

    def clip_fractions(self, reset: bool = True) -> dict[str, float]:
        """Fractions of ratio elements clipped at ``γ`` and at 1 since the last reset.

        Counts every element of every observed step (element-steps). One host read.

        Returns:
            ``{"gsnr/clip_low": f, "gsnr/clip_high": f}``; NaN for both when nothing was observed.
        """
        *clipped, elements = (0, 0, 0) if self._clip_counts is None else self._clip_counts.tolist()
        low, high = (count / elements if elements else math.nan for count in clipped)
        if reset and self._clip_counts is not None:
            self._clip_counts.zero_()
        return {CLIP_LOW: low, CLIP_HIGH: high}

    def _gather(self, group: Group, pending: dict[int, torch.Tensor]) -> Lists:
        """The group's parameters that have a gradient, their gradients and their ratios."""
        params, grads, ratios = [], [], []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError(f"{type(self).__name__} does not support sparse gradients")
            ratio = pending.get(id(p))
            if ratio is None:
                raise RuntimeError(
                    f"{type(self).__name__}.step: a parameter of shape {tuple(p.shape)} has a "
                    "gradient but no GSNR ratio (was it frozen when observe() ran?)"
                )
            params.append(p)
            grads.append(p.grad)
            ratios.append(ratio)
        return params, grads, ratios

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update with the ratios of the last ``observe()``/``set_gsnr()``.

        Args:
            closure: Optional; re-evaluates the loss (and may call ``observe()`` itself).

        Raises:
            RuntimeError: No GSNR was observed since the previous step.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if self._pending is None:
            raise RuntimeError(
                f"{type(self).__name__}.step: call observe(per_sample_grads) (or set_gsnr) "
                "before every step; VRGD needs per-sample gradients (pipeline=functional)"
            )
        pending, self._pending = self._pending, None
        for group in self.param_groups:
            params, grads, ratios = self._gather(group, pending)
            if params:
                self._update(group, params, grads, ratios)
        return loss

    @staticmethod
    def _scaled_with_decay(
        group: Group, params: Tensors, grads: Tensors, ratios: Tensors
    ) -> Tensors:
        """``r ⊙ ḡ + weight_decay · θ`` per tensor (the decay on the unscaled parameter)."""
        return GSNROptimizer._with_decay(group, params, torch._foreach_mul(grads, ratios))

    @staticmethod
    def _with_decay(group: Group, params: Tensors, step: Tensors) -> Tensors:
        """``step + weight_decay · θ`` per tensor, in place on ``step`` (our own tensors)."""
        if group["weight_decay"] != 0:
            torch._foreach_add_(step, params, alpha=group["weight_decay"])
        return step

    def _update(self, group: Group, params: Tensors, grads: Tensors, ratios: Tensors) -> None:
        """Update ``params`` in place from ``grads`` (ḡ) and ``ratios`` (r), both per tensor."""
        raise NotImplementedError
