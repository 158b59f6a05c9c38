"""Seeded, class-balanced subsets of a labelled dataset."""

from __future__ import annotations

import dataclasses

import torch

from grab_exp.data.arrays import TENSOR_FIELDS, ArrayData, array_data_from_uint8
from grab_exp.validation import check_number


def class_quotas(counts: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Split ``k`` picks over classes as equally as their sizes allow.

    Classes too small for an equal share give all their examples and the rest is shared among
    the others; the last ``k mod (classes left)`` picks go to classes drawn with ``generator``.

    Args:
        counts: ``(C,)`` number of examples in each class.
        k: Total number of picks, ``0 <= k <= counts.sum()``.
        generator: Source of randomness for the remainder.

    Returns:
        ``(C,)`` int64 picks per class, summing to ``k``, each at most its class count.
    """
    quotas = torch.zeros_like(counts, dtype=torch.int64)
    open_classes = torch.arange(len(counts))
    remaining = k
    while len(open_classes) > 0:
        share = remaining // len(open_classes)
        small = counts[open_classes] <= share
        if not small.any():
            break
        quotas[open_classes[small]] = counts[open_classes[small]]
        remaining -= int(counts[open_classes[small]].sum())
        open_classes = open_classes[~small]
    if len(open_classes) > 0:
        share, extra = divmod(remaining, len(open_classes))
        quotas[open_classes] = share
        lucky = torch.randperm(len(open_classes), generator=generator)[:extra]
        quotas[open_classes[lucky]] += 1
    return quotas


def stratified_subset(y: torch.Tensor, k: int, generator: torch.Generator) -> torch.Tensor:
    """Pick ``k`` example indices with classes as balanced as possible.

    Args:
        y: ``(N,)`` integer labels (non-negative).
        k: Number of examples to keep, ``1 <= k <= N``.
        generator: Seeded generator; the same seed gives the same subset.

    Returns:
        ``(k,)`` int64 indices into ``y``, sorted ascending, without repeats.

    Raises:
        ValueError: If ``k`` is not an integer in ``1 .. N``.
    """
    check_number("subset size", k, lambda v: 1 <= v <= len(y), f"an integer in 1..{len(y)}", int)
    labels = y.cpu()
    quotas = class_quotas(torch.bincount(labels), k, generator)
    picks = []
    for label, quota in enumerate(quotas.tolist()):
        members = torch.nonzero(labels == label).squeeze(1)
        picks.append(members[torch.randperm(len(members), generator=generator)[:quota]])
    return torch.sort(torch.cat(picks)).values


def take_subsets(
    data: ArrayData, subset: int | None = None, test_subset: int | None = None, seed: int = 0
) -> ArrayData:
    """Keep stratified, seeded subsets of the training and/or test set.

    Args:
        data: The full dataset.
        subset: Training examples to keep (``None`` keeps all); setting ``dataset.subset``.
        test_subset: Test examples to keep (``None`` keeps all); setting ``dataset.test_subset``.
        seed: Seed of the selection (``dataset.subset_seed``); each split uses its own
            generator seeded with it, so the training subset does not depend on ``test_subset``.

    Returns:
        The dataset restricted to the chosen examples, in their original order.

    Raises:
        ValueError: One line naming the setting when a size is out of range.
    """
    splits = _subsets([getattr(data, f) for f in TENSOR_FIELDS], subset, test_subset, seed)
    return dataclasses.replace(data, **dict(zip(TENSOR_FIELDS, splits, strict=True)))


def uint8_subsets(
    tensors: list[torch.Tensor],
    classes: tuple[str, ...] | list[str],
    subset: int | None = None,
    test_subset: int | None = None,
    seed: int = 0,
) -> ArrayData:
    """:func:`~grab_exp.data.arrays.array_data_from_uint8` of the subsets only: the same
    examples and values as :func:`take_subsets` of the whole converted dataset, with only the
    kept images converted to float32 (a job on 10,000 of CIFAR-10's 60,000 converts 10,000).

    Args:
        tensors: ``[train images (N, 3, 32, 32) uint8, train labels (N,), test images, test
            labels]``.
        classes: Class names in label order.
        subset, test_subset, seed: As :func:`take_subsets`.
    """
    return array_data_from_uint8(*_subsets(tensors, subset, test_subset, seed), classes=classes)


def _subsets(tensors: list[torch.Tensor], subset, test_subset, seed) -> list[torch.Tensor]:
    """``[train_x, train_y, test_x, test_y]`` restricted to each split's stratified subset,
    seeded with ``seed`` by a generator of its own (all sizes are checked, in one line naming
    the setting, before anything is selected)."""
    train_x, train_y, test_x, test_y = tensors
    splits = (
        (train_x, train_y, "dataset.subset", subset),
        (test_x, test_y, "dataset.test_subset", test_subset),
    )
    for _, y, setting, size in splits:
        _check_size(setting, size, len(y))
    out = []
    for x, y, _, size in splits:
        if size is None:
            out += [x, y]
            continue
        keep = stratified_subset(y, size, torch.Generator().manual_seed(seed)).to(y.device)
        out += [x[keep], y[keep]]
    return out


def _check_size(setting: str, size: int | None, available: int) -> None:
    if size is not None:
        allowed = f"null or an integer in 1..{available}"
        check_number(setting, size, lambda v: 1 <= v <= available, allowed, int)
