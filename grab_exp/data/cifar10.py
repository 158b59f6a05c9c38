"""CIFAR-10 through torchvision, downloaded into a data directory when absent."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from grab_exp.data.arrays import ArrayData
from grab_exp.data.download import (
    DOWNLOAD_ERRORS,
    REACH_TIMEOUT_S,
    reason,
    socket_timeout,
    unreachable,
)
from grab_exp.data.paths import resolve_cache_dir
from grab_exp.data.subset import uint8_subsets

#: the folder under the cache directory that ``data_dir: null`` means
DEFAULT_FOLDER = "cifar10"
#: CIFAR-10's own release, as torchvision's ``CIFAR10`` downloads and extracts it; the startup
#: check reads these, not torchvision (whose import alone takes seconds); a test keeps them equal
CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
BATCHES_FOLDER = "cifar-10-batches-py"
BATCH_FILES = (*(f"data_batch_{k}" for k in range(1, 6)), "test_batch")
#: the ways forward when CIFAR-10 can be neither read nor downloaded
ALTERNATIVES = (
    "use dataset=cifar10_jpeg dataset.archive=PATH for an offline archive "
    '(docs/experiments.md: "Getting CIFAR-10"), or experiment=smoke for a synthetic run'
)


def data_root(data_dir: str | os.PathLike[str] | None) -> Path:
    """The folder torchvision downloads into: ``data_dir`` from the repository root, or
    ``~/.cache/grab_exp/cifar10`` for ``None``."""
    if data_dir is None:
        return resolve_cache_dir(None) / DEFAULT_FOLDER
    return resolve_cache_dir(data_dir)


def on_disk(root: Path) -> bool:
    """Whether every extracted CIFAR-10 batch file is in ``root`` (checksums: torchvision's,
    when it loads them)."""
    return all((root / BATCHES_FOLDER / name).is_file() for name in BATCH_FILES)


def unavailable_error(root: Path, reason: str) -> RuntimeError:
    """The one line of a CIFAR-10 that is not in ``root`` and cannot be downloaded."""
    reason = " ".join(reason.split())
    return RuntimeError(
        f"dataset=cifar10: CIFAR-10 is not in {root} and could not be downloaded ({reason}); "
        + ALTERNATIVES
    )


def check_cifar10(
    data_dir: str | os.PathLike[str] | None = None,
    download_timeout_s: float = 30.0,
    **_loader_options: object,
) -> None:
    """Startup check of ``dataset=cifar10``: the data is on disk, or its server answers.

    Takes :func:`load_cifar10`'s options; reads no data, downloads nothing and does not import
    torchvision.

    Raises:
        RuntimeError: One line naming ``dataset=cifar10_jpeg dataset.archive=PATH`` and
            ``experiment=smoke`` (:func:`unavailable_error`).
    """
    root = data_root(data_dir)
    if on_disk(root):
        return
    reason = unreachable(CIFAR10_URL, min(download_timeout_s, REACH_TIMEOUT_S))
    if reason is not None:
        raise unavailable_error(root, reason)


def _split_tensors(split) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn a torchvision CIFAR10 split into ``(N, 3, 32, 32)`` uint8 images and ``(N,)`` labels."""
    images = torch.from_numpy(split.data).permute(0, 3, 1, 2).contiguous()
    return images, torch.tensor(split.targets, dtype=torch.int64)


def load_cifar10(
    data_dir: str | os.PathLike[str] | None = None,
    subset: int | None = None,
    test_subset: int | None = None,
    subset_seed: int = 0,
    download_timeout_s: float = 30.0,
) -> ArrayData:
    """Load torchvision's CIFAR-10 (downloading it on first use): 50,000 train / 10,000 test.

    Usable as a Hydra ``_target_`` (``conf/dataset/cifar10.yaml``).

    Args:
        data_dir: Directory torchvision downloads into; relative paths resolve against the
            repository root; ``None`` means ``~/.cache/grab_exp/cifar10``.
        subset: Keep a stratified, seeded subset of this many training examples.
        test_subset: Likewise for the test set.
        subset_seed: Seed of both subsets.
        download_timeout_s: Limit on each network operation of the download, in seconds.

    Returns:
        The dataset: ``train_x`` ``(N, 3, 32, 32)`` float32 in [-1, 1], ``train_y`` ``(N,)``,
        and the same for the test split.

    Raises:
        RuntimeError: One line naming the alternatives when the download fails.
    """
    from torchvision.datasets import CIFAR10

    root = data_root(data_dir)
    try:
        with socket_timeout(download_timeout_s):
            train = CIFAR10(root=root, train=True, download=True)
            test = CIFAR10(root=root, train=False, download=True)
    except DOWNLOAD_ERRORS as error:
        raise unavailable_error(root, reason(error)) from error
    train_arrays, test_arrays = _split_tensors(train), _split_tensors(test)
    tensors = [*train_arrays, *test_arrays]
    return uint8_subsets(tensors, train.classes, subset, test_subset, subset_seed)
