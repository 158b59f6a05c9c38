"""Small generated CIFAR-shaped data: smooth class prototype images plus Gaussian noise."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from grab_exp.data.arrays import ArrayData
from grab_exp.data.subset import take_subsets

IMAGE_SHAPE = (3, 32, 32)
PROTOTYPE_GRID = 4  # prototypes are 4x4 random colour grids, upsampled to 32x32


def _balanced_labels(count: int, num_classes: int, generator: torch.Generator) -> torch.Tensor:
    """Return ``(count,)`` int64 labels with class sizes differing by at most one, shuffled."""
    labels = torch.arange(count) % num_classes
    return labels[torch.randperm(count, generator=generator)]


def _smooth_prototypes(num_classes: int, signal: float, generator: torch.Generator) -> torch.Tensor:
    """Return ``(num_classes, 3, 32, 32)`` low-frequency images with values in [-signal, signal].

    Smooth (not per-pixel) patterns keep the problem learnable by convolutional nets with
    pooling, such as LeNet, as well as by linear models.
    """
    grid = torch.rand((num_classes, 3, PROTOTYPE_GRID, PROTOTYPE_GRID), generator=generator)
    return F.interpolate((grid * 2 - 1) * signal, size=IMAGE_SHAPE[1:], mode="bilinear")


def _noisy_examples(
    prototypes: torch.Tensor, labels: torch.Tensor, noise: float, generator: torch.Generator
) -> torch.Tensor:
    """Return ``(N, 3, 32, 32)`` images: ``prototype[label] + noise * N(0, 1)``, in [-1, 1]."""
    gaussian = torch.randn((len(labels), *IMAGE_SHAPE), generator=generator)
    return (prototypes[labels] + noise * gaussian).clamp_(-1.0, 1.0)


def make_synthetic(
    num_train: int = 2048,
    num_test: int = 512,
    num_classes: int = 10,
    signal: float = 0.5,
    noise: float = 0.5,
    seed: int = 0,
    subset: int | None = None,
    test_subset: int | None = None,
    subset_seed: int = 0,
) -> ArrayData:
    """Generate a learnable, CIFAR-shaped classification problem.

    Each class has a prototype image: a 4x4 grid of colours drawn uniformly from
    ``[-signal, signal]``, upsampled bilinearly to 32x32. An example is its class prototype plus
    ``noise`` times standard Gaussian noise, clipped to [-1, 1] like normalized CIFAR images.
    Classes are balanced in both splits. With the defaults, softmax regression reaches ~100%
    test accuracy and LeNet (SGD, lr 0.001, momentum 0.9, batch 16) ~50% within 2 epochs.

    Usable as a Hydra ``_target_`` (``conf/dataset/synthetic.yaml``).

    Args:
        num_train: Number of training examples.
        num_test: Number of test examples.
        num_classes: Number of classes.
        signal: Half-range of the prototype colour values (larger is easier).
        noise: Standard deviation of the per-pixel noise (larger is harder).
        seed: Seed of the generator; the same arguments always give the same tensors.
        subset: Keep a stratified, seeded subset of this many training examples.
        test_subset: Likewise for the test set.
        subset_seed: Seed of both subsets.

    Returns:
        The dataset: ``train_x`` ``(num_train, 3, 32, 32)`` float32, ``train_y``
        ``(num_train,)`` int64, and the same for the test split.
    """
    generator = torch.Generator().manual_seed(seed)
    prototypes = _smooth_prototypes(num_classes, signal, generator)
    train_y = _balanced_labels(num_train, num_classes, generator)
    test_y = _balanced_labels(num_test, num_classes, generator)
    data = ArrayData(
        train_x=_noisy_examples(prototypes, train_y, noise, generator),
        train_y=train_y,
        test_x=_noisy_examples(prototypes, test_y, noise, generator),
        test_y=test_y,
        classes=tuple(f"class{label}" for label in range(num_classes)),
    )
    return take_subsets(data, subset, test_subset, subset_seed)
