"""Checks of the GSNR settings (``gamma``, ``groups``, ``eps``) and of batch sizes against
``groups``: every failure is one ``ValueError`` line naming the ``optimizer.<key>`` setting."""

from __future__ import annotations

from grab_exp.validation import check_number, check_positive

__all__ = ["check_batch_sizes", "check_gsnr_settings", "resolve_groups"]


def check_gsnr_settings(gamma: float, groups: int | None, eps: float) -> None:
    """Raise a one-line ``ValueError`` naming the first bad setting.

    Args:
        gamma: Lower clip of the scaled ratio, in ``(0, 1]``.
        groups: Number of groups ``k`` (an integer >= 2) or ``None`` (one example per group).
        eps: Relative regularizer of the variance, > 0.
    """
    check_number("optimizer.gamma", gamma, lambda v: 0 < v <= 1, "a number in (0, 1]")
    if groups is not None:
        check_number("optimizer.groups", groups, lambda v: v >= 2, "null or an integer >= 2", int)
    check_positive("optimizer.eps", eps)


def resolve_groups(batch: int, groups: int | None) -> int:
    """The number of groups ``k`` for a batch of ``batch`` examples.

    Raises:
        ValueError: ``k < 2`` or ``batch`` is not a multiple of ``k`` (names ``optimizer.groups``).
    """
    k = batch if groups is None else groups
    shown = "null" if groups is None else repr(groups)
    if k < 2:
        raise ValueError(
            f"optimizer.groups: got {shown}, i.e. {k} group(s) for a batch of {batch}; "
            "GSNR needs >= 2 groups (a batch of >= 2 examples)"
        )
    if batch % k:
        raise ValueError(
            f"optimizer.groups: got {shown}; a batch of {batch} examples cannot be split into "
            f"{k} equal groups (allowed: a divisor of every batch size >= 2, or null)"
        )
    return k


def check_batch_sizes(groups: int | None, batch_size: int, num_examples: int) -> None:
    """Check, before training, that every batch of an epoch can be split into groups.

    An epoch of ``num_examples`` in batches of ``batch_size`` has full batches and, unless
    ``batch_size`` divides ``num_examples``, one last short batch; both must be divisible.

    Raises:
        ValueError: One line naming ``optimizer.groups`` (see :func:`resolve_groups`).
    """
    sizes = {min(batch_size, num_examples), num_examples % batch_size} - {0}
    for size in sorted(sizes, reverse=True):
        try:
            resolve_groups(size, groups)
        except ValueError as error:
            last = " (the epoch's last batch)" if size != min(batch_size, num_examples) else ""
            raise ValueError(f"{error}{last}") from None
