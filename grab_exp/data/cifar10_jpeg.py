"""CIFAR-10 from the JPEG archive in ``../shared/data``, decoded once, cached as uint8 tensors."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import torch

from grab_exp.data.arrays import ArrayData, array_data_from_uint8
from grab_exp.data.jpeg_archive import class_names, decode_split, read_encoded_images
from grab_exp.data.paths import resolve_cache_dir, resolve_from_repo
from grab_exp.data.subset import take_subsets
from grab_exp.data.tensor_cache import cache_file, load_tensors, save_atomically, source_sha256

log = logging.getLogger(__name__)

DEFAULT_ARCHIVE = "../shared/data/cifar10-jpeg.tar.gz"
ARCHIVE_SETTING = "dataset.archive"
CACHE_PREFIX = "cifar10-jpeg"
_TENSOR_KEYS = ("train_images", "train_labels", "test_images", "test_labels")


def resolve_archive(archive: str | os.PathLike[str] = DEFAULT_ARCHIVE) -> Path:
    """Return the archive (or extracted folder) path, relative paths taken from the repo root.

    Raises:
        FileNotFoundError: One line naming ``dataset.archive`` and the path tried.
    """
    path = resolve_from_repo(archive)
    if not path.exists():
        raise FileNotFoundError(
            f"{ARCHIVE_SETTING}: no CIFAR-10 JPEG archive at {path} "
            "(expected a .tar.gz or a folder with train/<class>/*.jpg and test/<class>/*.jpg)"
        )
    return path


def decode_source(source: Path) -> dict[str, object]:
    """Decode every image of a JPEG archive or folder.

    Args:
        source: The ``.tar.gz`` archive or extracted folder.

    Returns:
        ``train_images`` ``(50000, 3, 32, 32)`` uint8, ``train_labels`` ``(50000,)`` int64,
        ``test_images`` ``(10000, 3, 32, 32)`` uint8, ``test_labels`` ``(10000,)`` int64 (sizes
        for CIFAR-10), and ``classes`` (sorted names). Each split is ordered by class, then file.
    """
    encoded = read_encoded_images(source)
    classes = class_names(encoded, source)
    payload: dict[str, object] = {"classes": classes}
    for split in ("train", "test"):
        decoded = decode_split(encoded, split, classes)
        payload[f"{split}_images"], payload[f"{split}_labels"] = decoded.images, decoded.labels
    return payload


def load_or_decode(source: Path, cache_dir: Path) -> dict[str, object]:
    """Return the decoded source from the cache, decoding and caching it on a miss.

    The cache file is keyed by the source's sha256, so a changed archive is decoded again.

    Args:
        source: The ``.tar.gz`` archive or extracted folder.
        cache_dir: Directory of cache files (created when needed).

    Returns:
        The payload described in :func:`decode_source`.
    """
    started = time.perf_counter()
    path = cache_file(cache_dir, CACHE_PREFIX, source_sha256(source))
    if path.is_file():
        payload = load_tensors(path)
        log.info("read cached tensors %s in %.2f s", path, time.perf_counter() - started)
        return payload
    payload = decode_source(source)
    save_atomically(payload, path)
    log.info("decoded %s in %.2f s; cached at %s", source, time.perf_counter() - started, path)
    return payload


def load_cifar10_jpeg(
    archive: str | os.PathLike[str] = DEFAULT_ARCHIVE,
    cache_dir: str | os.PathLike[str] | None = None,
    subset: int | None = None,
    test_subset: int | None = None,
    subset_seed: int = 0,
) -> ArrayData:
    """Load CIFAR-10 from the JPEG archive: 50,000 train and 10,000 test images, normalized.

    Usable as a Hydra ``_target_`` (``conf/dataset/cifar10_jpeg.yaml``).

    Args:
        archive: The ``.tar.gz`` or an extracted folder; relative paths resolve against the
            repository root (the directory with pyproject.toml), not the working directory.
        cache_dir: Directory of decoded-tensor caches; ``None`` means ``~/.cache/grab_exp``.
        subset: Keep a stratified, seeded subset of this many training examples.
        test_subset: Likewise for the test set.
        subset_seed: Seed of both subsets.

    Returns:
        The dataset: ``train_x`` ``(N, 3, 32, 32)`` float32 in [-1, 1], ``train_y`` ``(N,)``,
        and the same for the test split; classes in alphabetical (= standard) label order.

    Raises:
        FileNotFoundError: If the archive is missing (one line naming ``dataset.archive``).
    """
    source = resolve_archive(archive)
    payload = load_or_decode(source, resolve_cache_dir(cache_dir))
    tensors = [payload[key] for key in _TENSOR_KEYS]
    if not all(isinstance(tensor, torch.Tensor) for tensor in tensors):
        raise ValueError(f"cache for {source} is malformed; delete it to decode again")
    data = array_data_from_uint8(*tensors, classes=payload["classes"])
    return take_subsets(data, subset, test_subset, subset_seed)
