"""Dataset loaders as a user writes them (a ``dataset._target_`` outside the package), each
returning real tensors with one thing wrong, for the checks of loaded data."""

from __future__ import annotations

import time

import torch

from grab_exp.data import ArrayData

CLASSES = tuple(f"class{k}" for k in range(10))


def images(n_train: int = 64, n_test: int = 16, seed: int = 0) -> ArrayData:
    """CIFAR-shaped images with labels 0..9, from a seeded generator."""
    generator = torch.Generator().manual_seed(seed)

    def split(n: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.rand(n, 3, 32, 32, generator=generator) * 2 - 1
        return x, torch.arange(n, dtype=torch.int64) % len(CLASSES)

    return ArrayData(*split(n_train), *split(n_test), classes=CLASSES)


def bad_label(split: str = "test", label: int = 10, index: int = 3) -> ArrayData:
    """Images whose ``split`` holds ``label`` at ``index``."""
    data = images()
    getattr(data, f"{split}_y")[index] = label
    return data


def non_finite(split: str = "test", value: float = float("nan"), index: int = 5) -> ArrayData:
    """Images whose ``split`` has ``value`` in example ``index``."""
    data = images()
    getattr(data, f"{split}_x")[index, 1, 2, 3] = value
    return data


def empty(split: str = "test") -> ArrayData:
    """Images with an empty ``split``."""
    return images(**{f"n_{split}": 0})


def slow(seconds: float = 3600.0, marker: str = "loading") -> ArrayData:
    """Images after ``seconds``; creates the file ``marker`` when it begins."""
    open(marker, "w").close()
    time.sleep(seconds)
    return images()
