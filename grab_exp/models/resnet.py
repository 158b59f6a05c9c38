"""torchvision's ResNet-18 for 32x32 images, with GroupNorm for BatchNorm."""

from __future__ import annotations

from torch import nn


def resnet18_gn(num_classes: int = 10, groups: int = 32) -> nn.Module:
    """ResNet-18 with a 3x3 stem and no max-pool (32x32 inputs) and ``GroupNorm(groups, C)`` in
    place of every BatchNorm: per-sample gradients are undefined under BatchNorm, which mixes the
    examples of a batch. 11,173,962 parameters with 10 classes.

    Args:
        num_classes: output logits.
        groups: GroupNorm's groups; a divisor of 64 (the narrowest layer's channels).
    """
    if groups < 1 or 64 % groups:
        raise ValueError(f"model.groups: got {groups}; allowed: a divisor of 64")
    from torchvision.models import resnet18  # here: LeNet and synthetic runs need no torchvision

    model = resnet18(num_classes=num_classes, norm_layer=lambda c: nn.GroupNorm(groups, c))
    model.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
    model.maxpool = nn.Identity()
    return model
