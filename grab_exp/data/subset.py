"""Seeded, class-balanced subsets of a labelled dataset."""

from __future__ import annotations

import dataclasses

import torch

from grab_exp.data.arrays import ArrayData


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
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= len(y):
        raise ValueError(f"subset size: got {k!r}; allowed: an integer in 1..{len(y)}")
    labels = y.cpu()
    quotas = class_quotas(torch.bincount(labels), k, generator)
    picks = []
    for label, quota in enumerate(quotas.tolist()):
        members = torch.nonzero(labels == label).squeeze(1)
        picks.append(members[torch.randperm(len(members), generator=generator)[:quota]])
    return torch.sort(torch.cat(picks)).values


def _checked_size(setting: str, size: int | None, available: int) -> int | None:
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= available:
        raise ValueError(f"{setting}: got {size!r}; allowed: null or an integer in 1..{available}")
    return size


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
    subset = _checked_size("dataset.subset", subset, len(data.train_y))
    test_subset = _checked_size("dataset.test_subset", test_subset, len(data.test_y))
    changes = {}
    for split, size in (("train", subset), ("test", test_subset)):
        if size is not None:
            labels = getattr(data, f"{split}_y")
            keep = stratified_subset(labels, size, torch.Generator().manual_seed(seed))
            keep = keep.to(labels.device)
            changes[f"{split}_x"] = getattr(data, f"{split}_x")[keep]
            changes[f"{split}_y"] = labels[keep]
    return dataclasses.replace(data, **changes) if changes else data
