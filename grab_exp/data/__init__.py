"""Datasets as preprocessed tensors (:class:`ArrayData`), each loader usable as a Hydra target."""

from grab_exp.data.array_file import check_arrays, load_arrays
from grab_exp.data.arrays import ArrayData, array_data_from_uint8, normalize_images
from grab_exp.data.cifar10 import check_cifar10, load_cifar10
from grab_exp.data.cifar10_jpeg import check_cifar10_jpeg, load_cifar10_jpeg, resolve_archive
from grab_exp.data.subset import stratified_subset, take_subsets
from grab_exp.data.synthetic import make_synthetic
from grab_exp.data.text import check_text, load_text
from grab_exp.data.vision import (
    check_image_folder,
    check_torchvision,
    load_image_folder,
    load_torchvision,
)

#: each loader's startup check: takes the loader's options, reads no data, raises one line
AVAILABILITY_CHECKS = {
    load_arrays: check_arrays,
    load_cifar10: check_cifar10,
    load_cifar10_jpeg: check_cifar10_jpeg,
    load_text: check_text,
    load_torchvision: check_torchvision,
    load_image_folder: check_image_folder,
}

__all__ = [
    "AVAILABILITY_CHECKS",
    "ArrayData",
    "array_data_from_uint8",
    "load_arrays",
    "load_cifar10",
    "load_cifar10_jpeg",
    "load_image_folder",
    "load_text",
    "load_torchvision",
    "make_synthetic",
    "normalize_images",
    "resolve_archive",
    "stratified_subset",
    "take_subsets",
]
