"""A seeded random projection ``R`` (``d x k``) applied block by block, never stored.

Rows ``[b * block_rows, (b + 1) * block_rows)`` of ``R`` form block ``b``; it is drawn from
a ``torch.Generator`` re-seeded with that block's seed at every use, so ``R`` is a pure
function of ``(seed, d, k, block_rows, kind)`` and of the device type (CPU and CUDA
generators differ): every rank applies the same projection and at most one
``block_rows x k`` block is in memory at a time. Kinds:

* ``rademacher``: entries ``±1/sqrt(k)``. One 32-bit draw gives 32 signs (its bits shifted
  into the float sign bit), about 5x faster than one draw per entry.
* ``gaussian``: entries ``N(0, 1/k)``.
* ``countsketch``: one ``±1`` per row of ``R`` in a random column (feature hashing): a
  scatter-add, ``O(P d)`` per call instead of the ``O(P d k)`` GEMM of the dense kinds. On
  CUDA the scatter adds repeated columns atomically, in a varying order: its sketches, and so
  the orders, are not bit-identical from run to run there (the one documented exception; use
  ``rademacher`` or ``gaussian`` where that matters). On the CPU it is deterministic.

All three give ``E<vR, wR> = <v, w>``.

A captured step (:mod:`grab_exp.runner.training.capture`) cannot re-seed a generator: :meth:`store`
keeps every block on the device first (``d x k`` values), and the projection reads them from
there, with the same values.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Iterator, Sequence

import torch

from grab_exp.devices import in_graph_safe
from grab_exp.validation import check_choice, check_int_at_least

KINDS = ("rademacher", "gaussian", "countsketch")
SEED_RANGE = 2**62
_ONE_BITS = 0x3F800000  # float32 1.0
_SIGN_BIT = -(2**31)  # int32 with only the sign bit set


@functools.cache
def _shifts(device: torch.device) -> torch.Tensor:
    """``(32,)`` int32 shifts that move bit ``31 - j`` of a word into its sign bit (made once
    per device, never written to)."""
    return torch.arange(32, dtype=torch.int32, device=device)


class BlockProjection:
    """``v -> v R`` for ``(P, d)`` inputs, ``R`` generated in ``(block_rows, k)`` blocks.

    Args:
        d: input length.
        k: output length (``projection_dim``).
        seed: seed of the projection (the same on every rank).
        block_rows: rows of ``R`` generated at once (bounds memory: ``block_rows * k``).
        kind: ``rademacher`` | ``gaussian`` | ``countsketch``.
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
        self.d, self.k, self.block_rows, self.kind, self.seed = d, k, block_rows, kind, seed
        self.dtype, self.device = dtype, torch.device(device)
        self.scale = 1.0 if kind == "countsketch" else 1.0 / math.sqrt(k)
        blocks = -(-d // block_rows)
        seeds = torch.randint(SEED_RANGE, (blocks,), generator=torch.Generator().manual_seed(seed))
        self.block_seeds: list[int] = seeds.tolist()
        self.generator = torch.Generator(device=self.device)
        self._stored: list | None = None  # per block: (columns, signs) or the unscaled block

    def store(self) -> None:
        """Keep every block of ``R`` on the device (made once), for a captured step."""
        if self._stored is not None:
            return
        blocks = range(len(self.block_seeds))
        if self.kind == "countsketch":
            self._stored = [self._hashes(b) for b in blocks]
        else:
            self._stored = [self._unscaled_block(b).clone() for b in blocks]

    def _blocks(self, b: int, bits: torch.Tensor | None = None) -> torch.Tensor | tuple:
        """Block ``b`` as ``__call__`` reads it: stored, or drawn now (not while captured)."""
        if self._stored is not None:
            return self._stored[b]
        if in_graph_safe():
            raise RuntimeError(
                "projection: a captured step cannot re-seed a generator; call the ordering's "
                "prepare_capture() first (it stores R)"
            )
        return self._hashes(b) if self.kind == "countsketch" else self._unscaled_block(b, bits)

    def _rows(self, b: int) -> int:
        return min(self.block_rows, self.d - b * self.block_rows)

    def _signs(self, count: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """``(count,)`` float32 ``±1`` from ``ceil(count / 32)`` int32 draws (32 signs each).

        ``out``: optional ``(>= ceil(count / 32), 32)`` int32 buffer reused across blocks.
        """
        words = -(-count // 32)
        draws = torch.randint(
            -(2**31),
            2**31,
            (words, 1),
            dtype=torch.int32,
            generator=self.generator,
            device=self.device,
        )  # (W, 1)
        bits = out[:words] if out is not None else None
        bits = torch.bitwise_left_shift(draws, _shifts(self.device), out=bits)  # (W, 32)
        bits.bitwise_and_(_SIGN_BIT).bitwise_or_(_ONE_BITS)  # float32 bits of ±1.0
        return bits.view(torch.float32).view(-1)[:count]

    def _unscaled_block(self, b: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Block ``b`` of ``R / scale`` for the dense kinds: ``(rows, k)``."""
        rows = self._rows(b)
        self.generator.manual_seed(self.block_seeds[b])
        if self.kind == "gaussian":
            return torch.randn(
                (rows, self.k), generator=self.generator, device=self.device, dtype=self.dtype
            )
        block = self._signs(rows * self.k, out).view(rows, self.k)  # (rows, k) float32
        return block if self.dtype == torch.float32 else block.to(self.dtype)

    def _hashes(self, b: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Count sketch block ``b``: ``(rows,)`` columns and ``(rows,)`` signs ``±1``."""
        rows = self._rows(b)
        self.generator.manual_seed(self.block_seeds[b])
        draws = torch.randint(
            2 * self.k, (rows,), generator=self.generator, device=self.device
        )  # (rows,): column in the high part, sign in the lowest bit
        signs = (draws & 1).to(self.dtype).mul_(2).sub_(1)  # (rows,)
        return draws >> 1, signs

    def block(self, b: int) -> torch.Tensor:
        """Block ``b`` of ``R``: ``(rows, k)``, ``rows = min(block_rows, d - b * block_rows)``."""
        if self.kind == "countsketch":
            columns, signs = self._hashes(b)
            block = torch.zeros(len(columns), self.k, dtype=self.dtype, device=self.device)
            return block.index_put_(
                (torch.arange(len(columns), device=self.device), columns), signs
            )
        return self._unscaled_block(b).mul(self.scale)

    def __call__(self, vectors: torch.Tensor | Sequence[torch.Tensor]) -> torch.Tensor:
        """Project ``(P, d)`` vectors to ``(P, k)``.

        Args:
            vectors: ``(P, d)``, or ``(P, d_i)`` parts whose columns side by side are the
                ``d`` values (e.g. one per parameter tensor: no ``(P, d)`` copy is made).
        """
        parts = [vectors] if isinstance(vectors, torch.Tensor) else list(vectors)
        width = sum(part.shape[-1] for part in parts)
        if width != self.d:
            raise ValueError(f"projection: got {width} values per row; expected d={self.d}")
        out = torch.zeros(len(parts[0]), self.k, dtype=self.dtype, device=self.device)  # (P, k)
        blocks = enumerate(_column_blocks(parts, self.block_rows))  # (P, block_rows) each
        if self.kind == "countsketch":
            for b, rows in blocks:
                columns, signs = self._blocks(b)
                out.index_add_(1, columns, self._cast(rows) * signs)  # (P, rows) -> (P, k)
            return out
        bits = None  # one int32 (W, 32) buffer for every block's signs
        if self.kind == "rademacher" and self._stored is None:
            words = -(-min(self.block_rows, self.d) * self.k // 32)
            bits = torch.empty(words, 32, dtype=torch.int32, device=self.device)
        for b, rows in blocks:
            out.addmm_(self._cast(rows), self._blocks(b, bits))  # (P, rows) @ (rows, k)
        return out.mul_(self.scale)

    def _cast(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.to(device=self.device, dtype=self.dtype)

    def dense(self) -> torch.Tensor:
        """The whole ``(d, k)`` matrix (for tests on small ``d`` only)."""
        return torch.cat([self.block(b) for b in range(len(self.block_seeds))])


def _column_blocks(parts: list[torch.Tensor], width: int) -> Iterator[torch.Tensor]:
    """Consecutive ``(P, width)`` column blocks (the last may be narrower) of the parts side by
    side: views of one part where a block lies inside it, else a small concatenation."""
    pieces: list[torch.Tensor] = []
    filled = 0
    for part in parts:
        start = 0
        while start < part.shape[1]:
            take = min(width - filled, part.shape[1] - start)
            pieces.append(part[:, start : start + take])
            start, filled = start + take, filled + take
            if filled == width:
                yield pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)
                pieces, filled = [], 0
    if pieces:
        yield pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


PROJECTION_SEED_OFFSET = 0x9E3779B9  # the projection's seed: (balance seed + this) mod 2^63


def balance_projection(
    d: int,
    dim: int | None,
    *,
    kind: str,
    block_rows: int,
    seed: int,
    dtype: torch.dtype,
    device: torch.device,
) -> BlockProjection | None:
    """The sketch ``g -> g R`` an ordering balances with, or ``None``: built here for all.

    With ``dim = k`` the ordering balances ``(B, k)`` sketches of its ``(B, d)`` gradients
    and allocates its state with ``k`` values per vector. ``R``'s seed is
    ``(seed + PROJECTION_SEED_OFFSET) mod 2^63``: the same ordering seed gives the same ``R``
    (also after ``load_state_dict``, which checks it), and ``R``'s stream is independent of
    the ordering's generator (first order, kernel thresholds).

    Args:
        d: gradient values per example.
        dim: ``projection_dim``: ``None``, or an integer in ``[1, d)`` (a sketch as long
            as the gradient saves nothing).
        kind: ``projection_kind``, one of ``KINDS``.
        block_rows: ``projection_block_rows`` (>= 1).
        seed: the ordering's seed.
        dtype, device: of ``R``.

    Raises:
        ValueError: one line naming the setting and the allowed values.
    """
    check_choice("balance.projection_kind", kind, KINDS)
    check_int_at_least("balance.projection_block_rows", block_rows, 1)
    if dim is None:
        return None
    if isinstance(dim, bool) or not isinstance(dim, int) or not 1 <= dim < d:
        raise ValueError(
            f"balance.projection_dim: got {dim!r} with d={d} gradient values per "
            "example; allowed: null or an integer >= 1 and < d"
        )
    seed = (seed + PROJECTION_SEED_OFFSET) % 2**63
    return BlockProjection(
        d, dim, seed=seed, block_rows=block_rows, kind=kind, dtype=dtype, device=device
    )


def describe(projection: BlockProjection | None) -> dict | None:
    """The settings that fix ``R`` (what a checkpoint must match, the device type included:
    CPU and CUDA generators draw different ``R``), or ``None``."""
    if projection is None:
        return None
    keys = ("k", "kind", "block_rows", "seed")
    return {
        **{key: getattr(projection, key) for key in keys},
        "device_type": projection.device.type,
    }
