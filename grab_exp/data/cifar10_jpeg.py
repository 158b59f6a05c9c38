"""CIFAR-10 from the JPEG archive in ``../shared/data``, decoded once, cached as uint8 tensors."""

from __future__ import annotations

import logging
import os
import tarfile
import time
import zlib
from pathlib import Path
from typing import Any

import torch

from grab_exp.data.arrays import ArrayData
from grab_exp.data.jpeg_archive import class_names, decode_split, read_encoded_images
from grab_exp.data.paths import resolve_cache_dir, resolve_from_repo
from grab_exp.data.subset import uint8_subsets
from grab_exp.data.tensor_cache import cache_file, load_tensors, save_atomically, source_sha256

log = logging.getLogger(__name__)

DEFAULT_ARCHIVE = "../shared/data/cifar10-jpeg.tar.gz"
ARCHIVE_SETTING = "dataset.archive"
CACHE_PREFIX = "cifar10-jpeg"
#: 2: the payload records ``format`` and the archive's full ``archive_sha256``
CACHE_FORMAT = 2
_TENSOR_KEYS = ("train_images", "train_labels", "test_images", "test_labels")
#: CIFAR-10's classes in label order (alphabetical) and examples per class of each split
CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
PER_CLASS = {"train": 5_000, "test": 1_000}
#: what reading or decoding a damaged archive raises (tarfile, gzip, zlib, the JPEG decoder)
ARCHIVE_ERRORS = (OSError, EOFError, zlib.error, tarfile.TarError, RuntimeError, ValueError)


def resolve_archive(archive: str | os.PathLike[str] = DEFAULT_ARCHIVE) -> Path:
    """Return the archive (or extracted folder) path, relative paths taken from the repo root.

    Raises:
        FileNotFoundError: One line naming ``dataset.archive`` and the path tried.
    """
    path = resolve_from_repo(archive)
    if not path.exists():
        raise FileNotFoundError(
            f"{ARCHIVE_SETTING}: no CIFAR-10 JPEG archive at {path} "
            "(expected a .tar.gz or a folder with train/<class>/*.jpg and test/<class>/*.jpg); "
            'give dataset.archive=PATH (docs/experiments.md: "Getting CIFAR-10"), or use '
            "dataset=cifar10 (downloaded on first use) or experiment=smoke (synthetic)"
        )
    return path


def check_cifar10_jpeg(
    archive: str | os.PathLike[str] = DEFAULT_ARCHIVE, **_loader_options: object
) -> None:
    """Startup check of ``dataset=cifar10_jpeg``: the archive exists (nothing is read).

    Takes :func:`load_cifar10_jpeg`'s options.

    Raises:
        FileNotFoundError: One line naming ``dataset.archive`` (:func:`resolve_archive`).
    """
    resolve_archive(archive)


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


def payload_problem(payload: Any) -> str | None:
    """What makes ``payload`` not decoded CIFAR-10, or ``None``: its shapes, counts, labels
    (each class exactly as often as in CIFAR-10) and class names."""
    if not isinstance(payload, dict) or payload.get("classes") != CLASSES:
        return "not the 10 CIFAR-10 classes"
    for split, per_class in PER_CLASS.items():
        images, labels = payload.get(f"{split}_images"), payload.get(f"{split}_labels")
        if not (isinstance(images, torch.Tensor) and isinstance(labels, torch.Tensor)):
            return f"no {split} tensors"
        count = per_class * len(CLASSES)
        if images.dtype != torch.uint8 or tuple(images.shape) != (count, 3, 32, 32):
            return f"{split} images {images.dtype} {tuple(images.shape)}, not uint8 {count}x3x32x32"
        if labels.dtype != torch.int64 or labels.shape != (count,):
            return f"{split} labels {labels.dtype} {tuple(labels.shape)}, not int64 ({count},)"
        if labels.min() < 0 or labels.max() >= len(CLASSES):
            return f"{split} labels outside 0..{len(CLASSES) - 1}"
        if torch.bincount(labels, minlength=len(CLASSES)).ne(per_class).any():
            return f"{split} labels are not {per_class} per class"
    return None


def _cached(path: Path, digest: str) -> dict[str, object] | None:
    """The checked payload of the cache file ``path``, or ``None`` (warning why) to decode."""
    if not path.is_file():
        return None
    try:
        payload = load_tensors(path)
    except Exception as error:  # truncated or not a tensor file: decode again
        problem = f"unreadable ({type(error).__name__})"
    else:
        if not isinstance(payload, dict) or payload.get("format") != CACHE_FORMAT:
            problem = f"cache format is not {CACHE_FORMAT}"
        elif payload.get("archive_sha256") != digest:
            problem = "made from another archive (sha256 differs)"
        else:
            problem = payload_problem(payload)
    if problem is None:
        return payload
    log.warning("decoded-data cache %s: %s; decoding the archive again", path, problem)
    return None


def _decode_checked(source: Path) -> dict[str, object]:
    """:func:`decode_source`, with any failure as one line naming the archive."""
    try:
        payload = decode_source(source)
    except ARCHIVE_ERRORS as error:
        first_line = (str(error).strip().splitlines() or [""])[0]
        problem = f"{type(error).__name__}: {first_line[:100]}"
    else:
        problem = payload_problem(payload)
    if problem is not None:
        raise ValueError(
            f"{ARCHIVE_SETTING}: {source} is damaged or not a CIFAR-10 JPEG archive ({problem})"
        ) from None
    return payload


def load_or_decode(source: Path, cache_dir: Path) -> dict[str, object]:
    """Return the decoded source from the cache, decoding and caching it on a miss.

    The cache file is keyed by the source's sha256 and records it in full with its format
    version. A cache that fails to load or to check (:func:`payload_problem`) is decoded again
    with a warning naming it.

    Args:
        source: The ``.tar.gz`` archive or extracted folder.
        cache_dir: Directory of cache files (created when needed).

    Returns:
        The payload described in :func:`decode_source`.

    Raises:
        ValueError: the archive is damaged or not CIFAR-10 (one line naming it).
    """
    started = time.perf_counter()
    digest = source_sha256(source)
    path = cache_file(cache_dir, CACHE_PREFIX, digest)
    if (payload := _cached(path, digest)) is not None:
        log.info("read cached tensors %s in %.2f s", path, time.perf_counter() - started)
        return payload
    payload = {**_decode_checked(source), "format": CACHE_FORMAT, "archive_sha256": digest}
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
    return uint8_subsets(tensors, payload["classes"], subset, test_subset, subset_seed)
