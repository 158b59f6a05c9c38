"""Datasets as preprocessed tensors (:class:`ArrayData`), each loader usable as a Hydra target."""

from grab_exp.data.arrays import ArrayData, array_data_from_uint8, normalize_images
from grab_exp.data.cifar10 import check_cifar10, load_cifar10
from grab_exp.data.cifar10_jpeg import check_cifar10_jpeg, load_cifar10_jpeg, resolve_archive
from grab_exp.data.subset import stratified_subset, take_subsets
from grab_exp.data.synthetic import make_synthetic

#: each loader's startup check: takes the loader's options, reads no data, raises one line
AVAILABILITY_CHECKS = {load_cifar10: check_cifar10, load_cifar10_jpeg: check_cifar10_jpeg}

__all__ = [
    "AVAILABILITY_CHECKS",
    "ArrayData",
    "array_data_from_uint8",
    "load_cifar10",
    "load_cifar10_jpeg",
    "make_synthetic",
    "normalize_images",
    "resolve_archive",
    "stratified_subset",
    "take_subsets",
]
