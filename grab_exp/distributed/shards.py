"""Seeded split of a training set into ``W`` equal shards, one per worker."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from grab_exp.validation import check_int_at_least

SEED_RANGE = 2**62  # per-rank seeds are drawn from [0, SEED_RANGE)


@dataclass(frozen=True)
class ShardSplit:
    """The examples each worker owns.

    Attributes:
        shards: ``(W, m)`` int64 global example indices, row ``r`` owned by rank ``r``;
            ``m = n // W``.
        dropped: ``(n - W m,)`` int64 global indices no worker trains on (``W`` does not
            divide ``n``).
    """

    shards: torch.Tensor
    dropped: torch.Tensor

    @property
    def num_dropped(self) -> int:
        """How many examples were dropped so that every shard has ``m`` examples."""
        return self.dropped.numel()


def split_shards(n: int, world_size: int, seed: int = 0) -> ShardSplit:
    """Split ``range(n)`` into ``world_size`` equal shards with a seeded permutation.

    The permutation comes from a ``torch.Generator`` seeded with ``seed``, so every rank
    computes the same split without communicating. The last ``n % world_size`` examples of
    the permutation are dropped.

    Args:
        n: number of training examples.
        world_size: number of workers ``W`` (``1 <= W <= n``).
        seed: seed of the split.

    Returns:
        The split: ``shards`` ``(W, n // W)`` and ``dropped`` ``(n % W,)``.
    """
    check_int_at_least("n", n, 1)
    check_int_at_least("world_size", world_size, 1)
    if world_size > n:
        raise ValueError(f"world_size: got {world_size}; allowed: at most n={n} workers")
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(seed))  # (n,)
    m = n // world_size
    return ShardSplit(
        shards=perm[: world_size * m].reshape(world_size, m), dropped=perm[world_size * m :]
    )


def rank_seeds(seed: int, world_size: int) -> list[int]:
    """Distinct-with-high-probability seeds for each rank's own generator.

    Args:
        seed: the run's seed.
        world_size: number of workers ``W``.

    Returns:
        ``W`` Python ints, entry ``r`` for rank ``r`` (the same on every rank).
    """
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(SEED_RANGE, (world_size,), generator=generator).tolist()
