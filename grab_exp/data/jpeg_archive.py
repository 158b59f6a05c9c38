"""Read an ImageFolder-layout JPEG dataset from a .tar.gz archive or a folder, and decode it.

Layout: ``<split>/<class>/<name>.jpg`` with split ``train`` or ``test``. Images are decoded with
``torchvision.io.decode_jpeg`` on a list of encoded images (batched), which measured faster than
PIL (about 3.0 s vs 5.5 s for all 60,000 CIFAR-10 images on 2 CPU cores; identical pixels).
"""

from __future__ import annotations

import io
import re
import tarfile
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

SPLITS = ("train", "test")
_MEMBER_PATTERN = re.compile(r"^(?:\./)?(train|test)/([^/]+)/([^/]+\.jpe?g)$", re.IGNORECASE)
_DECODE_CHUNK = 10_000


@dataclass(frozen=True)
class EncodedImage:
    """One JPEG file of the dataset, not yet decoded."""

    split: str
    class_name: str
    file_name: str
    data: bytes


@dataclass(frozen=True)
class DecodedSplit:
    """One split, decoded.

    Attributes:
        images: ``(N, 3, H, W)`` uint8 RGB images, sorted by class then file name.
        labels: ``(N,)`` int64 labels (index into the class list).
    """

    images: torch.Tensor
    labels: torch.Tensor


def _files(source: Path) -> Iterator[tuple[str, Callable[[], bytes]]]:
    """``(relative name, reader of its bytes)`` of every file of a folder or archive."""
    if source.is_dir():
        for path in sorted(source.glob("*/*/*")):
            if path.is_file():
                yield path.relative_to(source).as_posix(), path.read_bytes
        return
    with tarfile.open(source, mode="r:*") as tar:
        for member in tar:
            if member.isfile():
                yield member.name, tar.extractfile(member).read


def read_encoded_images(source: Path) -> list[EncodedImage]:
    """Read every ``<split>/<class>/<name>.jpg`` of a .tar(.gz) archive or an extracted folder.

    Args:
        source: Path of the archive or of the folder holding ``train/`` and ``test/``.

    Returns:
        The encoded images, sorted by split, class, then file name.
    """
    matches = ((_MEMBER_PATTERN.match(name), read) for name, read in _files(source))
    members = [EncodedImage(*match.groups(), read()) for match, read in matches if match]
    return sorted(members, key=lambda image: (image.split, image.class_name, image.file_name))


def class_names(images: list[EncodedImage], source: Path) -> list[str]:
    """Return the sorted class names, checking that every split has the same classes.

    Raises:
        ValueError: If a split is missing or the splits' classes differ.
    """
    per_split = {
        split: sorted({im.class_name for im in images if im.split == split}) for split in SPLITS
    }
    if not all(per_split.values()) or per_split["train"] != per_split["test"]:
        found = {split: len(names) for split, names in per_split.items()}
        raise ValueError(
            f"{source}: expected train/<class>/*.jpg and test/<class>/*.jpg with the same "
            f"classes; found class folders per split: {found}"
        )
    return per_split["train"]


def _decode_with_pil(encoded: list[bytes]) -> list[torch.Tensor]:
    """Decode JPEGs one by one with PIL into ``(3, H, W)`` uint8 tensors."""
    import numpy as np
    from PIL import Image

    def decode_one(data: bytes) -> torch.Tensor:
        pixels = np.array(Image.open(io.BytesIO(data)).convert("RGB"))
        return torch.from_numpy(pixels).permute(2, 0, 1)

    return [decode_one(data) for data in encoded]


def _decode_with_torchvision(encoded: list[bytes]) -> list[torch.Tensor]:
    """Decode JPEGs in batches with ``torchvision.io.decode_jpeg`` into ``(3, H, W)`` uint8."""
    from torchvision.io import ImageReadMode, decode_jpeg

    decoded: list[torch.Tensor] = []
    with warnings.catch_warnings():  # torchvision 0.29 deprecates its codecs for TorchCodec
        warnings.filterwarnings("ignore", "The image decoding", DeprecationWarning)
        for start in range(0, len(encoded), _DECODE_CHUNK):
            chunk = encoded[start : start + _DECODE_CHUNK]
            buffers = [torch.frombuffer(bytearray(data), dtype=torch.uint8) for data in chunk]
            decoded += decode_jpeg(buffers, mode=ImageReadMode.RGB)
    return decoded


def decode_jpegs(encoded: list[bytes]) -> torch.Tensor:
    """Decode same-sized JPEGs to RGB, with torchvision when it has ``decode_jpeg``, else PIL.

    Both give identical pixels (libjpeg-turbo); torchvision's batched decoder is about twice
    as fast.

    Args:
        encoded: JPEG file contents.

    Returns:
        ``(N, 3, H, W)`` uint8 images.
    """
    try:
        decoded = _decode_with_torchvision(encoded)
    except ImportError:
        decoded = _decode_with_pil(encoded)
    return torch.stack(decoded)


def decode_split(images: list[EncodedImage], split: str, classes: list[str]) -> DecodedSplit:
    """Decode the images of one split, in the order given (class, then file name).

    Args:
        images: Encoded images of all splits, sorted as :func:`read_encoded_images` returns them.
        split: ``"train"`` or ``"test"``.
        classes: Class names in label order.

    Returns:
        The decoded split.
    """
    selected = [image for image in images if image.split == split]
    label_of = {name: label for label, name in enumerate(classes)}
    labels = torch.tensor([label_of[image.class_name] for image in selected], dtype=torch.int64)
    return DecodedSplit(decode_jpegs([image.data for image in selected]), labels)
