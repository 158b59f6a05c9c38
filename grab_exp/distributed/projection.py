"""A seeded random projection ``R`` (``d x k``) applied block by block, never stored.

Rows ``[b * block_rows, (b + 1) * block_rows)`` of ``R`` form block ``b``; it is drawn from
a ``torch.Generator`` re-seeded with that block's seed at every use, so ``R`` is a pure
function of ``(seed, d, k, block_rows, kind)``: every rank applies the same projection and
at most one ``block_rows x k`` block is in memory at a time. Entries are Rademacher
(``±1/sqrt(k)``) or Gaussian (``N(0, 1/k)``), so ``E<Rv, Rw> = <v, w>``.
"""

from __future__ import annotations

import math

import torch

from grab_exp.validation import check_choice, check_int_at_least

KINDS = ("rademacher", "gaussian")
SEED_RANGE = 2**62


class BlockProjection:
    """``v -> v R`` for ``(P, d)`` inputs, ``R`` generated in ``(block_rows, k)`` blocks.

    Args:
        d: input length.
        k: output length (``projection_dim``).
        seed: seed of the projection (the same on every rank).
        block_rows: rows of ``R`` generated at once (bounds memory: ``block_rows * k``).
        kind: ``rademacher`` | ``gaussian``.
        dtype: dtype of ``R`` and of the output.
        device: device where the blocks are drawn.
    """

    def __init__(
        self,
        d: int,
        k: int,
        *,
        seed: int = 0,
        block_rows: int = 4096,
        kind: str = "rademacher",
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        check_int_at_least("d", d, 1)
        check_int_at_least("projection_dim", k, 1)
        check_int_at_least("projection_block_rows", block_rows, 1)
        check_choice("projection_kind", kind, KINDS)
        self.d, self.k, self.block_rows, self.kind = d, k, block_rows, kind
        self.dtype, self.device = dtype, torch.device(device)
        self.scale = 1.0 / math.sqrt(k)
        blocks = -(-d // block_rows)
        seeds = torch.randint(SEED_RANGE, (blocks,), generator=torch.Generator().manual_seed(seed))
        self.block_seeds: list[int] = seeds.tolist()
        self.generator = torch.Generator(device=self.device)

    def block(self, b: int) -> torch.Tensor:
        """Block ``b`` of ``R``: ``(rows, k)``, ``rows = min(block_rows, d - b * block_rows)``."""
        rows = min(self.block_rows, self.d - b * self.block_rows)
        self.generator.manual_seed(self.block_seeds[b])
        shape, kw = (rows, self.k), {"generator": self.generator, "device": self.device}
        if self.kind == "gaussian":
            return torch.randn(shape, dtype=self.dtype, **kw).mul_(self.scale)
        bits = torch.randint(0, 2, shape, dtype=self.dtype, **kw)  # {0, 1}
        return bits.mul_(2 * self.scale).sub_(self.scale)

    def __call__(self, vectors: torch.Tensor) -> torch.Tensor:
        """Project ``(P, d)`` vectors to ``(P, k)``."""
        if vectors.shape[-1] != self.d:
            raise ValueError(
                f"projection: got {vectors.shape[-1]} values per row; expected d={self.d}"
            )
        out = torch.zeros(vectors.shape[0], self.k, dtype=self.dtype, device=self.device)  # (P, k)
        for b, start in enumerate(range(0, self.d, self.block_rows)):
            rows = vectors[:, start : start + self.block_rows].to(self.dtype)  # (P, rows)
            out.addmm_(rows, self.block(b))
        return out

    def dense(self) -> torch.Tensor:
        """The whole ``(d, k)`` matrix (for tests on small ``d`` only)."""
        return torch.cat([self.block(b) for b in range(len(self.block_seeds))])
