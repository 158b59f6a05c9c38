"""Multinomial logistic regression on flattened images."""

from __future__ import annotations

import torch
from torch import nn


class LogReg(nn.Module):
    """One linear layer on flattened inputs; trained with cross-entropy it is softmax regression.

    Args:
        in_features: Size of one flattened input (3 * 32 * 32 = 3072 for CIFAR-10).
        num_classes: Number of output logits.
    """

    def __init__(self, in_features: int = 3072, num_classes: int = 10) -> None:
        super().__init__()
        self.linear = nn.Linear(in_features, num_classes)

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        """Map inputs to class logits.

        Args:
            inputs: ``(B, ...)`` with ``in_features`` elements per example, e.g. ``(B, 3, 32, 32)``.

        Returns:
            ``(B, num_classes)`` logits.
        """
        return self.linear(torch.flatten(inputs, start_dim=1))
