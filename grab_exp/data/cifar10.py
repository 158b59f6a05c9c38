"""CIFAR-10 through torchvision, downloaded into a data directory when absent."""

from __future__ import annotations

import contextlib
import os
import socket
import urllib.error
from collections.abc import Iterator

import torch

from grab_exp.data.arrays import ArrayData, array_data_from_uint8
from grab_exp.data.paths import resolve_cache_dir
from grab_exp.data.subset import take_subsets

DOWNLOAD_ERRORS = (urllib.error.URLError, OSError, RuntimeError)


@contextlib.contextmanager
def socket_timeout(seconds: float) -> Iterator[None]:
    """Bound every blocking socket operation (connect, read) opened inside the block."""
    previous = socket.getdefaulttimeout()
    socket.setdefaulttimeout(seconds)
    try:
        yield
    finally:
        socket.setdefaulttimeout(previous)


def _split_tensors(split) -> tuple[torch.Tensor, torch.Tensor]:
    """Turn a torchvision CIFAR10 split into ``(N, 3, 32, 32)`` uint8 images and ``(N,)`` labels."""
    images = torch.from_numpy(split.data).permute(0, 3, 1, 2).contiguous()
    return images, torch.tensor(split.targets, dtype=torch.int64)


def _download_error(data_dir: os.PathLike[str], error: Exception) -> RuntimeError:
    reason = " ".join(str(error).split()) or type(error).__name__
    return RuntimeError(
        f"dataset=cifar10: could not download CIFAR-10 into {data_dir} ({reason}); offline, use "
        "dataset=cifar10_jpeg, which reads ../shared/data/cifar10-jpeg.tar.gz"
    )


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
        RuntimeError: One line naming the ``cifar10_jpeg`` alternative when the download fails.
    """
    from torchvision.datasets import CIFAR10

    root = resolve_cache_dir(None) / "cifar10" if data_dir is None else resolve_cache_dir(data_dir)
    try:
        with socket_timeout(download_timeout_s):
            train = CIFAR10(root=root, train=True, download=True)
            test = CIFAR10(root=root, train=False, download=True)
    except DOWNLOAD_ERRORS as error:
        raise _download_error(root, error) from error
    train_arrays, test_arrays = _split_tensors(train), _split_tensors(test)
    data = array_data_from_uint8(*train_arrays, *test_arrays, classes=train.classes)
    return take_subsets(data, subset, test_subset, subset_seed)
