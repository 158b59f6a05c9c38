"""The seeded block projection of CD-GraB's sketches: one implementation, shared with the
single-process orderings (``balance.projection_dim``), in :mod:`grab_exp.balance.projection`."""

from __future__ import annotations

from grab_exp.balance.projection import KINDS, SEED_RANGE, BlockProjection

__all__ = ["KINDS", "SEED_RANGE", "BlockProjection"]
