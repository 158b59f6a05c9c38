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

    Each ``BatchNorm*d(C)`` becomes ``GroupNorm(gcd(C, max_groups), C)`` (a ``BatchNorm1d``:
    groups of at least two channels, right on ``(B, C)`` inputs too) with the same ``eps``,
    affinity, weight and bias, device and dtype. ``ValueError``: ``max_groups < 1``, ``model``
    itself a BatchNorm, or a ``BatchNorm1d`` of one channel (named)."""
    check_int_at_least("max_groups", max_groups, 1)
    if isinstance(model, BATCHNORM):
        raise ValueError("batchnorm_to_groupnorm: the model is a BatchNorm layer; wrap it first")
    for prefix, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, BATCHNORM):
                name = f"{prefix}.{child_name}" if prefix else child_name
                setattr(module, child_name, _group_norm(child, max_groups, name))
    return model


def _group_norm(batch_norm: nn.Module, max_groups: int, name: str) -> nn.GroupNorm:
    """Its GroupNorm: ``gcd(C, max_groups)`` groups; for a ``BatchNorm1d`` (``(B, C)`` inputs: a
    group of one value normalizes it to 0), groups of at least two channels."""
    channels = batch_norm.num_features
    groups = math.gcd(channels, max_groups)
    if isinstance(batch_norm, nn.BatchNorm1d):
        fitting = [g for g in range(1, min(max_groups, channels // 2) + 1) if channels % g == 0]
        if not fitting:
            raise ValueError(
                f"batchnorm_to_groupnorm: {name} (BatchNorm1d) has {channels} channel: on (B, C) "
                "inputs a GroupNorm of it outputs its bias whatever the input; remove that layer "
                "or use a LayerNorm"
            )
        groups = fitting[-1]
    like = batch_norm.weight if batch_norm.affine else batch_norm.running_mean
    options = {} if like is None else {"device": like.device, "dtype": like.dtype}
    norm = nn.GroupNorm(groups, channels, eps=batch_norm.eps, affine=batch_norm.affine, **options)
    if batch_norm.affine:
        with torch.no_grad():
            norm.weight.copy_(batch_norm.weight)
            norm.bias.copy_(batch_norm.bias)
    norm.train(batch_norm.training)
    return norm
