"""Multi-layer perceptron on flattened images."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import nn


class MLP(nn.Module):
    """Fully connected ReLU network on flattened inputs.

    Args:
        in_features: Size of one flattened input (3 * 32 * 32 = 3072 for CIFAR-10).
        hidden: Widths of the hidden layers, in order; empty for a linear model.
        num_classes: Number of output logits.
    """

    def __init__(
        self, in_features: int = 3072, hidden: Sequence[int] = (256,), num_classes: int = 10
    ) -> None:
        super().__init__()
        widths = [in_features, *(int(width) for width in hidden)]
        layers: list[nn.Module] = []
        for width_in, width_out in itertools.pairwise(widths):
            layers += [nn.Linear(width_in, width_out), nn.ReLU()]
        layers.append(nn.Linear(widths[-1], num_classes))
        self.layers = nn.Sequential(*layers)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Map inputs to class logits.

        Args:
            inputs: ``(B, ...)`` with ``in_features`` elements per example, e.g. ``(B, 3, 32, 32)``.

        Returns:
            ``(B, num_classes)`` logits.
        """
        return self.layers(torch.flatten(inputs, start_dim=1))
