"""torchvision's image datasets by name, and a folder of images (``ImageFolder``).

Each is read whole into ``(N, C, H, W)`` uint8 tensors, then normalized as CIFAR-10 is (to
``[0, 1]``, mean 0.5 and std 0.5 per channel, no augmentation); subsets are stratified and
seeded as CIFAR-10's. MNIST and Fashion-MNIST are ``1 x 28 x 28``, CIFAR-100 and SVHN
``3 x 32 x 32``: the model must take them (``model=mlp model.in_features=784`` for MNIST; the
runner refuses a model that does not, in one line).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from grab_exp.data.arrays import ArrayData
from grab_exp.data.download import DOWNLOAD_ERRORS, REACH_TIMEOUT_S, socket_timeout, unreachable
from grab_exp.data.paths import resolve_cache_dir, resolve_from_cwd
from grab_exp.data.subset import uint8_subsets

#: name -> (torchvision class, a URL its download reads: the startup check asks it)
DATASETS = {
    "cifar100": ("CIFAR100", "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"),
    "mnist": ("MNIST", "https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels-idx1-ubyte.gz"),
    "fashion_mnist": (
        "FashionMNIST",
        "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/t10k-labels-idx1-ubyte.gz",
    ),
    "svhn": ("SVHN", "http://ufldl.stanford.edu/housenumbers/test_32x32.mat"),
}
OFFLINE = "or dataset=image_folder dataset.root=PATH for images on disk, or experiment=smoke"


def _root(name: str, data_dir: str | os.PathLike[str] | None) -> Path:
    return resolve_cache_dir(data_dir) / name


def _split(name: str, root: Path, train: bool, download: bool):
    import torchvision.datasets as tv

    cls = getattr(tv, DATASETS[name][0])
    if name == "svhn":
        return cls(root=str(root), split="train" if train else "test", download=download)
    return cls(root=str(root), train=train, download=download)


def _tensors(split) -> tuple[torch.Tensor, torch.Tensor]:
    """``(N, C, H, W)`` uint8 images and ``(N,)`` labels of a torchvision split."""
    images = torch.as_tensor(np.asarray(split.data))
    if images.dim() == 3:  # MNIST's (N, H, W)
        images = images.unsqueeze(1)
    elif images.shape[-1] == 3:  # CIFAR-100's (N, H, W, C); SVHN's is (N, C, H, W) already
        images = images.permute(0, 3, 1, 2)
    labels = getattr(split, "targets", None)
    labels = split.labels if labels is None else labels
    return images.contiguous(), torch.as_tensor(np.asarray(labels), dtype=torch.int64)


def _classes(name: str, split) -> tuple[str, ...]:
    classes = getattr(split, "classes", None)
    return tuple(classes) if classes else tuple(str(k) for k in range(10))  # SVHN: the digits


def check_torchvision(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    download_timeout_s: float = 30.0,
    **_loader_options: object,
) -> None:
    """Startup check: the dataset is on disk, or its server answers (one line if neither)."""
    if name not in DATASETS:
        raise ValueError(f"dataset.name: got {name!r}; allowed: {', '.join(DATASETS)}")
    root = _root(name, data_dir)
    try:
        _split(name, root, train=False, download=False)
        return
    except (RuntimeError, OSError):
        pass
    reason = unreachable(DATASETS[name][1], min(download_timeout_s, REACH_TIMEOUT_S))
    if reason is not None:
        raise RuntimeError(
            f"dataset={name}: not in {root} and could not be downloaded ({reason}); {OFFLINE}"
        )


def load_torchvision(
    name: str,
    data_dir: str | os.PathLike[str] | None = None,
    subset: int | None = None,
    test_subset: int | None = None,
    subset_seed: int = 0,
    download_timeout_s: float = 30.0,
) -> ArrayData:
    """One of torchvision's datasets by name (:data:`DATASETS`), downloaded on first use.

    Usable as a Hydra ``_target_`` (``conf/dataset/{cifar100,mnist,fashion_mnist,svhn}.yaml``).

    Args:
        name: ``cifar100``, ``mnist``, ``fashion_mnist`` or ``svhn``.
        data_dir: where the data lives (``None``: ``~/.cache/grab_exp/<name>``).
        subset, test_subset: stratified, seeded subsets of each split (``None``: all).
        subset_seed: the subsets' seed.
        download_timeout_s: limit on each network operation of the download.
    """
    check_torchvision(name, data_dir, download_timeout_s)
    root = _root(name, data_dir)
    try:
        with socket_timeout(download_timeout_s):
            train, test = (_split(name, root, flag, download=True) for flag in (True, False))
    except DOWNLOAD_ERRORS as error:
        raise RuntimeError(f"dataset={name}: the download failed ({error}); {OFFLINE}") from error
    tensors = [*_tensors(train), *_tensors(test)]
    return uint8_subsets(tensors, _classes(name, train), subset, test_subset, subset_seed)


def check_image_folder(root: str | os.PathLike[str] | None = None, **_options: object) -> None:
    """Startup check: ``dataset.root`` holds ``train/`` and ``test/`` (one line if not, saying
    where it looked: a relative root is taken from the folder the command ran in)."""
    folder = None if root is None else resolve_from_cwd(root)
    for split in ("train", "test"):
        if folder is None or not (folder / split).is_dir():
            where = "" if folder is None else f" (looked in {folder})"
            raise FileNotFoundError(
                f"dataset.root: got {root!r}{where}, which has no {split}/ folder; allowed: a "
                "folder with train/<class>/<images> and test/<class>/<images>"
            )


def load_image_folder(
    root: str | os.PathLike[str] | None = None,
    size: int = 32,
    subset: int | None = None,
    test_subset: int | None = None,
    subset_seed: int = 0,
) -> ArrayData:
    """Images on disk in torchvision's ``ImageFolder`` layout: ``root/train/<class>/*`` and
    ``root/test/<class>/*`` (the classes of ``train``), each resized to ``size x size`` RGB.

    A relative ``root`` is taken from the folder the command ran in. Each image is read as
    8-bit RGB (:func:`read_image`: 16-bit grey scaled to 8 bits, other depths refused).
    Usable as a Hydra ``_target_`` (``conf/dataset/image_folder.yaml``).

    Raises:
        FileNotFoundError: ``root`` lacks ``train/`` or ``test/``, or a class folder holds no
            image (one line).
        ValueError: a file that is not an image this loader reads (one line naming it).
    """
    from torchvision import transforms
    from torchvision.datasets import ImageFolder

    check_image_folder(root)
    folder = resolve_from_cwd(root)
    prepare = transforms.Compose([transforms.Resize((size, size)), transforms.PILToTensor()])
    splits = []
    for split in ("train", "test"):
        try:
            splits.append(ImageFolder(str(folder / split), loader=read_image, transform=prepare))
        except FileNotFoundError as error:  # torchvision's: a class folder without images
            raise FileNotFoundError(f"dataset.root: {folder / split}: {error}") from None
    train, test = splits
    if test.classes != train.classes:
        raise ValueError(f"dataset.root: test/ has classes {test.classes}, train/ {train.classes}")
    tensors = []
    for split in (train, test):
        images = torch.stack([image for image, _ in split]) if len(split) else None
        tensors += [images, torch.tensor(split.targets, dtype=torch.int64)]
    return uint8_subsets(tensors, train.classes, subset, test_subset, subset_seed)


#: PIL's modes of 16-bit grey images (``I`` too, where its values lie in 0..65535)
SIXTEEN_BIT_MODES = ("I;16", "I;16L", "I;16B", "I;16N", "I")


def read_image(path: str) -> Any:
    """The image file ``path`` as an 8-bit RGB PIL image (grey repeated, alpha dropped).

    16-bit grey (PIL's ``I;16*``, or ``I`` within 0..65535) is scaled to 8 bits,
    ``round(v * 255 / 65535)``; floating-point or wider images are refused.

    Raises:
        ValueError: not an image PIL reads, or of a depth refused (one line naming the file).
    """
    from PIL import Image

    try:
        with Image.open(path) as image:
            image.load()
            pixels = np.asarray(image) if image.mode in (*SIXTEEN_BIT_MODES, "F") else None
            if pixels is None:
                return image.convert("RGB")
    except OSError as error:  # PIL's UnidentifiedImageError, a truncated file
        raise ValueError(
            f"dataset.root: {path} is not an image this loader reads ({error})"
        ) from None
    if image.mode == "F" or pixels.min() < 0 or pixels.max() > 65535:
        raise ValueError(
            f"dataset.root: {path} is a {image.mode}-mode image with values "
            f"{pixels.min()}..{pixels.max()}; allowed: 8-bit images, or 16-bit grey (0..65535)"
        )
    eight = (pixels.astype(np.uint32) * 255 + 65535 // 2) // 65535
    return Image.fromarray(eight.astype(np.uint8)).convert("RGB")  # 2-D uint8: L
