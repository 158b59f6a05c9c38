"""Small datasets on disk in the layouts torchvision's readers take (real readers, made data)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
from PIL import Image

MNIST_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}


def write_mnist(raw: Path, counts: dict[str, int], seed: int = 0) -> dict[str, np.ndarray]:
    """MNIST's idx files (28 x 28 uint8 images, labels 0-9) into ``raw``; the labels by split."""
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    labels = {}
    for split, (images_name, labels_name) in MNIST_FILES.items():
        n = counts[split]
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels[split] = np.arange(n, dtype=np.uint8) % 10
        (raw / images_name).write_bytes(struct.pack(">iiii", 2051, n, 28, 28) + images.tobytes())
        (raw / labels_name).write_bytes(struct.pack(">ii", 2049, n) + labels[split].tobytes())
    return labels


def write_image_folder(root: Path, classes: tuple[str, ...], per_class: int, size: int = 20):
    """``root/{train,test}/<class>/<k>.png``: RGB images of ``size x size`` (a grey one too)."""
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        for label in classes:
            folder = root / split / label
            folder.mkdir(parents=True)
            for k in range(per_class):
                pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
                image = Image.fromarray(pixels)
                (image.convert("L") if k == 0 else image).save(folder / f"{k}.png")
