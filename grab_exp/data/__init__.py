"""Datasets as preprocessed tensors (:class:`ArrayData`), each loader usable as a Hydra target."""

from grab_exp.data.arrays import ArrayData, array_data_from_uint8, normalize_images
from grab_exp.data.cifar10 import load_cifar10
from grab_exp.data.cifar10_jpeg import load_cifar10_jpeg, resolve_archive
from grab_exp.data.subset import stratified_subset, take_subsets
from grab_exp.data.synthetic import make_synthetic

__all__ = [
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
