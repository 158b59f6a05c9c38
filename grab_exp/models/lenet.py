"""LeNet-5 for 32x32 RGB images (the CIFAR-10 tutorial network)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class LeNet(nn.Module):
    """LeNet-5: two 5x5 conv + max-pool stages, then three fully connected layers.

    conv 3->6 (k5) -> ReLU -> max-pool 2 -> conv 6->16 (k5) -> ReLU -> max-pool 2
    -> fc 400->120 -> ReLU -> fc 120->84 -> ReLU -> fc 84->num_classes.
    With ``num_classes=10`` it has exactly 62,006 parameters. No BatchNorm, no Dropout, so
    per-sample gradients with ``torch.func`` need no special handling.

    Args:
        num_classes: Number of output logits.
    """

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, kernel_size=5)
        self.conv2 = nn.Conv2d(6, 16, kernel_size=5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """Map images to class logits.

        Args:
            images: ``(B, 3, 32, 32)`` float images.

        Returns:
            ``(B, num_classes)`` logits.
        """
        features = F.max_pool2d(F.relu(self.conv1(images)), 2)  # (B, 6, 14, 14)
        features = F.max_pool2d(F.relu(self.conv2(features)), 2)  # (B, 16, 5, 5)
        hidden = torch.flatten(features, start_dim=1)  # (B, 400)
        hidden = F.relu(self.fc1(hidden))
        hidden = F.relu(self.fc2(hidden))
        return self.fc3(hidden)
