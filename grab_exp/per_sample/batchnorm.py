"""BatchNorm to GroupNorm, which normalizes every example on its own (as DP libraries do)."""

from __future__ import annotations

import math

import torch
from torch import nn

from grab_exp.per_sample.modules import BATCHNORM
from grab_exp.validation import check_int_at_least

__all__ = ["batchnorm_to_groupnorm"]


def batchnorm_to_groupnorm(model: nn.Module, max_groups: int = 32) -> nn.Module:
    """Replace every BatchNorm layer of ``model`` (in place) with a GroupNorm; return ``model``.

    Each ``BatchNorm2d(C)`` or ``BatchNorm3d(C)`` becomes ``GroupNorm(gcd(C, max_groups), C)``,
    each ``BatchNorm1d(C)`` ``GroupNorm(1, C)`` (on ``(B, C)`` inputs a group normalizes its own
    channels alone: a group of two outputs their sign, of one a constant), with the same ``eps``,
    affinity, weight and bias, device and dtype. ``ValueError``: ``max_groups < 1``, ``model``
    itself a BatchNorm, or a ``BatchNorm1d`` of one or two channels (named)."""
    check_int_at_least("max_groups", max_groups, 1)
    if isinstance(model, BATCHNORM):
        raise ValueError("batchnorm_to_groupnorm: the model is a BatchNorm layer; wrap it first")
    replaced = [  # all made before any is set: a refusal leaves the model as it was
        (module, child_name, _group_norm(child, max_groups, f"{prefix}.{child_name}".lstrip(".")))
        for prefix, module in model.named_modules()
        for child_name, child in module.named_children()
        if isinstance(child, BATCHNORM)
    ]
    for module, child_name, norm in replaced:
        setattr(module, child_name, norm)
    return model


def _group_norm(batch_norm: nn.Module, max_groups: int, name: str) -> nn.GroupNorm:
    """Its GroupNorm: ``gcd(C, max_groups)`` groups; one for a ``BatchNorm1d``, whose inputs may
    be ``(B, C)`` vectors (a LayerNorm's normalization, with per-channel weights)."""
    channels = batch_norm.num_features
    groups = math.gcd(channels, max_groups)
    if isinstance(batch_norm, nn.BatchNorm1d):
        if channels <= 2:
            raise ValueError(
                f"batchnorm_to_groupnorm: {name} (BatchNorm1d) has {channels} channel(s): on (B, "
                "C) inputs a normalization of each example's own values outputs a constant (one) "
                "or their sign (two), whatever the input; remove that layer"
            )
        groups = 1
    like = batch_norm.weight if batch_norm.affine else batch_norm.running_mean
    options = {} if like is None else {"device": like.device, "dtype": like.dtype}
    norm = nn.GroupNorm(groups, channels, eps=batch_norm.eps, affine=batch_norm.affine, **options)
    if batch_norm.affine:
        with torch.no_grad():
            norm.weight.copy_(batch_norm.weight)
            norm.bias.copy_(batch_norm.bias)
    norm.train(batch_norm.training)
    return norm
