"""``GradientOrdering``: the base of the orderings that read per-sample gradients.

Beyond :class:`~grab_exp.balance.base.Ordering`'s options it holds what balancing needs: the
sign kernel, normalization, the balancing state's dtype and an optional projection, and it
hands each step's gradients to :meth:`GradientOrdering._balance` as ``GradRows``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from grab_exp.balance.base import NO_WORK, Ordering, Work
from grab_exp.balance.kernels import make_kernel
from grab_exp.balance.projection import balance_projection
from grab_exp.balance.tensors import as_dtype
from grab_exp.grads.batch import grad_rows
from grab_exp.grads.rows import GradRows, keep_views, kept_view


class GradientOrdering(Ordering):
    """An ordering that balances per-sample gradients.

    Args:
        n: number of examples (per worker, with lanes).
        d: length of one flattened per-sample gradient.
        kernel: sign kernel, ``deterministic`` or ``probabilistic``.
        c: the probabilistic kernel's scale (> 0).
        normalize: scale every balanced vector to unit norm first.
        dtype: dtype of the balancing state (``torch.float32`` or a name).
        projection_dim: ``None``, or ``k < d``: balance seeded ``k``-dim sketches ``g R``
            (see :func:`~grab_exp.balance.projection.balance_projection`; ``R`` has its own
            random stream, independent of the generator's).
        projection_kind, projection_block_rows: ``R``'s entries and rows generated at once.
        seed: the ordering's seed (its generator's, and ``R``'s through its own offset).
        device: device of the orders and of the balancing state.
        **options: the rest of :class:`~grab_exp.balance.base.Ordering`'s (``first_epoch``,
            ``lanes``).
    """

    needs_grads: ClassVar[bool] = True

    def __init__(
        self,
        n: int,
        d: int,
        *,
        kernel: str = "deterministic",
        c: float = 30.0,
        normalize: bool = False,
        dtype: torch.dtype | str = torch.float32,
        projection_dim: int | None = None,
        projection_kind: str = "rademacher",
        projection_block_rows: int = 4096,
        seed: int = 0,
        device: torch.device | str = "cpu",
        **options: Any,
    ) -> None:
        self.kernel = make_kernel(kernel, c)
        self.normalize = bool(normalize)
        self.dtype = as_dtype(dtype)
        self.projection = balance_projection(
            d,
            projection_dim,
            kind=projection_kind,
            block_rows=projection_block_rows,
            seed=seed,
            dtype=self.dtype,
            device=torch.device(device),
        )
        self.dim = d if self.projection is None else self.projection.k  # balanced length
        self._scratch_buffers: dict[str, torch.Tensor] = {}
        super().__init__(n, d, seed=seed, device=device, **options)

    def _balance(self, grads: Any, positions: torch.Tensor) -> None:
        """Balance the gradients of visit positions ``positions (B,)`` (what :meth:`_grad_rows`
        gave). The positions are device values: a step reads none on the host.

        For one worker they are ``B`` rows of length ``dim`` (``d``, or ``projection_dim`` when
        sketched): a materialized ``(B, dim)`` matrix or factors (:mod:`grab_exp.grads`), read
        only through the ``GradRows`` operations.
        """
        raise NotImplementedError

    def work(self, rows: int) -> Work:
        """The rows read once (``rows x d`` values of the state's dtype), their sketch ``g R``
        where there is one (``R`` made on the fly: not counted as traffic), their norms under
        ``normalize``, and the balancing itself at the balanced length (:meth:`_balance_work`)."""
        size = self.dtype.itemsize
        read = Work(rows * self.d * size, 0)
        sketch = NO_WORK if self.projection is None else Work(0, 2 * rows * self.d * self.dim)
        norms = Work(0, 2 * rows * self.dim) if self.normalize else NO_WORK
        return read + sketch + norms + self._balance_work(rows, self.dim, size)

    def _balance_work(self, rows: int, dim: int, size: int) -> Work:
        """The balancing of ``rows`` rows of ``dim`` values of ``size`` bytes: by default one
        dot product with the accumulator and one update of it per row (4 flops a value), the
        accumulator read and written once."""
        return Work(2 * dim * size, 4 * rows * dim)

    def _take(self, grads: Any, positions: torch.Tensor) -> None:
        self._balance(self._grad_rows(grads), positions)

    def _grad_rows(self, grads: torch.Tensor | Mapping[str, torch.Tensor]) -> GradRows:
        """One step's gradients as :meth:`_balance` reads them, on the ordering's device."""
        options = {"out": self._flat_buffer, "keep_factors": self.reads_factors}
        return grad_rows(grads, self.d, self.device, self.dtype, self.projection, **options)

    def prepare_capture(self) -> None:
        """Store the projection's ``R`` on the device before a capture (it is drawn from
        re-seeded generators, which a captured step cannot do)."""
        if self.projection is not None:
            self.projection.store()

    def _prepare(self, vectors: GradRows) -> GradRows:
        """Apply the ``normalize`` option (in place where the vectors are scratch)."""
        return vectors.normalized() if self.normalize else vectors

    def _scratch(self, slot: str, rows: int, width: int | None = None) -> torch.Tensor:
        """A reusable ``(rows, width or dim)`` buffer (per-step allocations fault pages on CPU)."""
        buffer = self._scratch_buffers.get(slot)
        if buffer is None or buffer.shape[0] < rows:
            buffer = torch.empty(rows, width or self.dim, dtype=self.dtype, device=self.device)
            buffer = self._scratch_buffers[slot] = keep_views(buffer)
        return kept_view(buffer, rows, lambda: buffer[:rows])

    def _flat_buffer(self, rows: int) -> torch.Tensor | None:
        """The scratch rows for a dict of gradients that lives on this device."""
        return self._scratch("flat", rows, self.d)

    def _thresholds(self, count: int) -> torch.Tensor:
        return self.kernel.thresholds(count, self.generator, self.dtype, self.device)
