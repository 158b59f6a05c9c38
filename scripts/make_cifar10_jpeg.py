#!/usr/bin/env python
"""Make the offline CIFAR-10 JPEG archive (``dataset=cifar10_jpeg``) from the binary CIFAR-10.

Example (the binary release, ``cifar-10-python.tar.gz`` or its extracted
``cifar-10-batches-py/``, in ``DIR``; nothing is downloaded when it is there)::

    python scripts/make_cifar10_jpeg.py cifar10-jpeg.tar.gz --data-dir DIR
    python -m grab_exp dataset=cifar10_jpeg dataset.archive=$PWD/cifar10-jpeg.tar.gz

Layout written: ``train/<class>/NNNN.jpg`` (5,000 per class) and ``test/<class>/NNNN.jpg``
(1,000 per class), classes by name in label order, files numbered in the binary release's
order within each class; JPEG quality 75 (the quality of the archive our results used).
"""

from __future__ import annotations

import argparse
import io
import sys
import tarfile
from pathlib import Path

from PIL import Image
from torchvision.datasets import CIFAR10

from grab_exp.data.cifar10 import DOWNLOAD_ERRORS, data_root

JPEG_QUALITY = 75


def _add_jpeg(archive: tarfile.TarFile, name: str, pixels) -> None:
    """Encode one ``(32, 32, 3)`` uint8 image as JPEG into ``archive`` at ``name``."""
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="JPEG", quality=JPEG_QUALITY)
    info = tarfile.TarInfo(name)
    info.size = buffer.tell()
    buffer.seek(0)
    archive.addfile(info, buffer)


def write_archive(out: Path, data_dir: Path) -> dict[str, int]:
    """Write the JPEG archive of the CIFAR-10 in ``data_dir``; return the images per split.

    Both splits are read before anything is written, and the archive appears under its name
    only when complete (written beside it, then renamed).
    """
    splits = {
        split: CIFAR10(root=data_dir, train=split == "train", download=True)
        for split in ("train", "test")
    }
    counts = {}
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w:gz") as archive:
        for split, dataset in splits.items():
            numbers = [0] * len(dataset.classes)
            for pixels, label in zip(dataset.data, dataset.targets, strict=True):
                name = f"{split}/{dataset.classes[label]}/{numbers[label]:04d}.jpg"
                _add_jpeg(archive, name, pixels)
                numbers[label] += 1
            counts[split] = sum(numbers)
    partial.replace(out)
    return counts


def main(argv: list[str] | None = None) -> int:
    """Command line: ``make_cifar10_jpeg.py OUT.tar.gz [--data-dir DIR]``."""
    cli = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    cli.add_argument("out", help="the .tar.gz to write")
    cli.add_argument(
        "--data-dir",
        default=str(data_root(None)),
        help="folder with the binary CIFAR-10 (downloaded there when absent; default: %(default)s)",
    )
    args = cli.parse_args(argv)
    try:
        counts = write_archive(Path(args.out), Path(args.data_dir))
    except DOWNLOAD_ERRORS as error:
        reason = " ".join(str(error).split()) or type(error).__name__
        print(
            f"error: --data-dir: no CIFAR-10 in {args.data_dir} and it could not be downloaded "
            f"({reason}); copy cifar-10-python.tar.gz (or cifar-10-batches-py/) there",
            file=sys.stderr,
        )
        return 1
    print(f"wrote {args.out}: {counts['train']:,} train and {counts['test']:,} test images")
    return 0


if __name__ == "__main__":
    sys.exit(main())
