"""The in-memory dataset type every loader returns, and the shared preprocessing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

#: the tensor fields of :class:`ArrayData`, in order
TENSOR_FIELDS = ("train_x", "train_y", "test_x", "test_y")


@dataclass(frozen=True)
class ArrayData:
    """A whole dataset held as tensors, already preprocessed: examples of any shape and their
    classes (images, sequences, table rows), or a token stream's windows and their next tokens.

    Attributes:
        train_x: ``(N, ...)`` float32 training inputs with at least one dimension per example:
            ``(N, C, H, W)`` images (normalized), ``(N, C, L)`` sequences, ``(N, F)`` table
            rows; or ``(N, T)`` int64 token windows.
        train_y: ``(N,)`` int64 training labels in ``0 .. len(classes) - 1``, or ``(N, T)``
            next tokens (a label per position).
        test_x: the test split's inputs, shaped like ``train_x`` past dimension 0.
        test_y: its labels.
        classes: Class names (a vocabulary's words); ``classes[label]`` names a label.
    """

    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor
    classes: tuple[str, ...]

    def __post_init__(self) -> None:
        for split in ("train", "test"):
            inputs, labels = getattr(self, f"{split}_x"), getattr(self, f"{split}_y")
            examples = inputs.dtype == torch.float32 and inputs.dim() >= 2
            tokens = inputs.dtype == torch.int64 and inputs.dim() == 2
            if not (examples or tokens):
                raise ValueError(
                    f"{split}_x must be (N, ...) float32 examples (images, sequences, table "
                    f"rows) or (N, T) int64 tokens; got {inputs.dtype} of shape "
                    f"{tuple(inputs.shape)}"
                )
            shape = inputs.shape if tokens else inputs.shape[:1]
            if labels.dtype != torch.int64 or labels.shape != shape:
                raise ValueError(f"{split}_y must be an int64 tensor of shape {tuple(shape)}")
        if (
            self.test_x.shape[1:] != self.train_x.shape[1:]
            or self.test_x.dtype != self.train_x.dtype
        ):
            raise ValueError(
                f"test_x must be shaped like train_x past dimension 0: train_x is "
                f"{self.train_x.dtype} (N, {', '.join(map(str, self.train_x.shape[1:]))}), "
                f"test_x {self.test_x.dtype} (M, {', '.join(map(str, self.test_x.shape[1:]))})"
            )

    @property
    def num_classes(self) -> int:
        """Number of classes."""
        return len(self.classes)

    def to(self, device: torch.device | str) -> ArrayData:
        """Return a copy whose tensors live on ``device`` (no copy when they already do)."""
        return dataclasses.replace(self, **{f: getattr(self, f).to(device) for f in TENSOR_FIELDS})


def normalize_images(images: torch.Tensor) -> torch.Tensor:
    """Scale uint8 images to [0, 1], then normalize with mean 0.5 / std 0.5 per channel.

    This is the preprocessing of the PyTorch CIFAR-10 tutorial, with no augmentation.

    Args:
        images: ``(N, 3, H, W)`` uint8 images.

    Returns:
        ``(N, 3, H, W)`` float32 images in [-1, 1].
    """
    if images.dtype != torch.uint8:
        raise TypeError(f"expected uint8 images, got {images.dtype}")
    return images.to(torch.float32).div_(255.0).sub_(0.5).div_(0.5)


def array_data_from_uint8(
    train_images: torch.Tensor,
    train_labels: torch.Tensor,
    test_images: torch.Tensor,
    test_labels: torch.Tensor,
    classes: tuple[str, ...] | list[str],
) -> ArrayData:
    """Build an :class:`ArrayData` from raw uint8 images, normalizing them once.

    Args:
        train_images: ``(N, 3, 32, 32)`` uint8 training images.
        train_labels: ``(N,)`` integer training labels.
        test_images: ``(M, 3, 32, 32)`` uint8 test images.
        test_labels: ``(M,)`` integer test labels.
        classes: Class names in label order.

    Returns:
        The normalized dataset.
    """
    return ArrayData(
        train_x=normalize_images(train_images),
        train_y=train_labels.to(torch.int64),
        test_x=normalize_images(test_images),
        test_y=test_labels.to(torch.int64),
        classes=tuple(classes),
    )
