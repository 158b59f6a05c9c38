"""Checks of a loaded dataset, whoever's loader made it: one line each, before any training.

:func:`check_loaded` refuses an empty split, a label outside the dataset's classes (on either
split) and an input that is not finite (NaN or infinite), naming the dataset setting, the split,
the first offending index and what is allowed.
"""

from __future__ import annotations

import torch

from grab_exp.data.arrays import ArrayData


class DataError(ValueError):
    """A loaded dataset that training cannot use (the message is one line naming it)."""


def check_loaded(data: ArrayData, setting: str) -> ArrayData:
    """``data``, checked.

    Args:
        data: What the loader returned.
        setting: The dataset as the user chose it, for the message (e.g.
            ``dataset=image_folder (grab_exp.data.load_image_folder)``).

    Returns:
        ``data``, unchanged.

    Raises:
        DataError: an empty split, a label outside ``0 .. len(classes) - 1`` or a
            non-finite input (one line). Test examples shaped unlike the training ones are
            refused by :class:`ArrayData` itself, when the loader builds it.
    """
    for split in ("train", "test"):
        inputs, labels = getattr(data, f"{split}_x"), getattr(data, f"{split}_y")
        if len(labels) == 0:
            raise DataError(f"{setting}: the {split} split is empty; allowed: 1 or more examples")
        _check_labels(labels, data.num_classes, f"{setting}: {split}_y")
        if inputs.is_floating_point():
            _check_finite(inputs, f"{setting}: {split}_x")
    return data


def _check_labels(labels: torch.Tensor, num_classes: int, where: str) -> None:
    rows = labels.reshape(len(labels), -1)  # a token stream has a label per position
    outside = (rows < 0) | (rows >= num_classes)
    if bool(outside.any()):
        index = int(outside.any(dim=1).nonzero()[0])
        value = int(rows[index][outside[index]][0])
        raise DataError(
            f"{where}[{index}] holds label {value}; allowed: 0..{num_classes - 1} "
            f"(the dataset's {num_classes} classes)"
        )


def _check_finite(inputs: torch.Tensor, where: str) -> None:
    bad = ~torch.isfinite(inputs.reshape(len(inputs), -1)).all(dim=1)
    if bool(bad.any()):
        index = int(bad.nonzero()[0])
        value = inputs.reshape(len(inputs), -1)[index]
        found = value[~torch.isfinite(value)][0].item()
        raise DataError(f"{where}[{index}] holds {found}; allowed: finite numbers")
