"""Factored per-sample gradients: the balance quantities without the ``(B, d)`` matrix.

Linear layers keep the factors of their per-sample gradients
(:mod:`~grab_exp.balance.linear_factors`); layers with few weights stay materialized
``(B, *shape)`` blocks and join through the same three quantities: dots with accumulators, the
Gram matrix and signed sums.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import replace

import torch

from grab_exp.balance.linear_factors import FactorBias, LinearFactors
from grab_exp.balance.rows import DenseRows, GradRows
from grab_exp.devices import same_device

Block = torch.Tensor | LinearFactors | FactorBias
#: dense blocks narrower than this are joined with their dense neighbours into one matrix
JOIN_WIDTH = 1 << 16


class FactoredGrads(GradRows, Mapping):
    """Per-sample gradients by parameter: materialized ``(B, *shape)`` or :class:`LinearFactors`.

    A ``Mapping`` name -> ``(B, *shape)``: reading an item materializes it (anew), so any code
    written for a dict of per-sample gradients works unchanged; ``Balance.step`` instead uses the
    :class:`~grab_exp.balance.rows.GradRows` operations, which never form the ``(B, d)`` matrix.
    They run over *segments* of consecutive columns: a Linear layer's factors with its bias, or
    a run of narrow materialized blocks joined into one ``(B, w)`` matrix (one GEMM, not one per
    parameter).

    Args:
        blocks: name -> block, in ``named_parameters`` order (the columns of ``d``); a Linear
            layer's bias is a :class:`FactorBias` of its weight's factors.
        shapes: name -> the parameter's shape.
    """

    def __init__(self, blocks: dict[str, Block], shapes: dict[str, torch.Size]) -> None:
        self.blocks, self.shapes = blocks, shapes
        first = next(iter(blocks.values()))
        first = first.factors if isinstance(first, FactorBias) else first
        self.like = first.a if isinstance(first, LinearFactors) else first
        self.rows = self.like.shape[0]
        self.width = sum(shape.numel() for shape in shapes.values())
        self._segments: list[tuple[slice, torch.Tensor | LinearFactors]] | None = None

    # --- Mapping: materialized (B, *shape) tensors ---------------------------------------
    def __getitem__(self, name: str) -> torch.Tensor:
        block = self.blocks[name]
        if isinstance(block, FactorBias):
            return block.factors.bias_grads()
        if isinstance(block, LinearFactors):  # not kept: memory
            return block.materialize().view(self.rows, *self.shapes[name])
        return block

    def __iter__(self) -> Iterator[str]:
        return iter(self.blocks)

    def __len__(self) -> int:
        return len(self.blocks)

    @property
    def factored_names(self) -> list[str]:
        """The parameters kept as factors."""
        return [n for n, b in self.blocks.items() if isinstance(b, LinearFactors)]

    def to(self, device: torch.device, dtype: torch.dtype) -> FactoredGrads:
        """The blocks on ``device`` in ``dtype`` (``self`` when they are there already)."""
        if same_device(self.like.device, device) and self.like.dtype == dtype:
            return self
        moved = {n: b.to(device, dtype) for n, b in self.blocks.items()}
        return FactoredGrads(moved, self.shapes)

    # --- GradRows ------------------------------------------------------------------------
    def segments(self) -> list[tuple[slice, torch.Tensor | LinearFactors]]:
        """``(columns, block)`` over all ``d`` columns: factors or a ``(B, w)`` matrix."""
        if self._segments is None:
            self._segments = _segments(self.blocks, self.shapes, self.rows)
        return self._segments

    def dots(self, acc):
        total = None
        for columns, block in self.segments():
            part = acc[..., columns]  # (w,) or (K, w)
            if isinstance(block, LinearFactors):
                dots = block.dots(part)
            else:
                dots = block @ part if acc.dim() == 1 else (part @ block.T).T
            total = dots if total is None else total.add_(dots)
        return total  # (B,) or (B, K)

    def gram(self):
        total = None
        for _, block in self.segments():
            gram = block.gram() if isinstance(block, LinearFactors) else block @ block.T
            total = gram if total is None else total.add_(gram)
        return total  # (B, B)

    def accumulate(self, acc, coef):
        for columns, block in self.segments():
            part = acc[..., columns]
            if isinstance(block, LinearFactors):
                block.accumulate(part, coef)
            elif acc.dim() == 1:
                part.addmv_(block.T, coef)
            else:
                part.addmm_(coef.T, block)

    def dense(self, out):
        for columns, block in self.segments():
            if isinstance(block, LinearFactors):
                weight, bias = block._split(out[:, columns])
                weight.copy_(block.materialize())
                if bias is not None:
                    bias.copy_(block.bias_grads())
            else:
                out[:, columns] = block
        return DenseRows(out)

    def row(self, i):
        parts = []
        for _, block in self.segments():
            if isinstance(block, LinearFactors):
                parts.append((block.delta[i].T @ block.a[i]).reshape(-1))  # (out * in,)
                if block.bias:
                    parts.append(block.delta[i].sum(0))  # (out,)
            else:
                parts.append(block[i])
        return torch.cat(parts)  # (d,)


def _segments(blocks: dict[str, Block], shapes: dict[str, torch.Size], rows: int) -> list:
    """Consecutive columns grouped: each Linear's factors (taking its :class:`FactorBias`
    right after it) and runs of narrow dense blocks joined into one ``(B, w)`` matrix."""
    segments: list[tuple[slice, torch.Tensor | LinearFactors]] = []
    run: list[torch.Tensor] = []  # dense blocks waiting to be joined, as (B, w)
    start = run_start = 0

    def flush() -> None:
        if run:
            matrix = run[0] if len(run) == 1 else torch.cat(run, dim=1)  # (B, w)
            segments.append((slice(run_start, run_start + matrix.shape[1]), matrix))
            run.clear()

    for name, block in blocks.items():
        stop = start + shapes[name].numel()
        last = segments[-1] if segments and not run else None
        if isinstance(block, LinearFactors):
            flush()
            segments.append((slice(start, stop), block))
        elif isinstance(block, FactorBias) and last is not None and last[1] is block.factors:
            segments[-1] = (slice(last[0].start, stop), replace(block.factors, bias=True))
        else:
            dense = block.factors.bias_grads() if isinstance(block, FactorBias) else block
            dense = dense.reshape(rows, -1)  # (B, w)
            if run and (dense.shape[1] >= JOIN_WIDTH or run[-1].shape[1] >= JOIN_WIDTH):
                flush()
            if not run:
                run_start = start
            run.append(dense)
        start = stop
    flush()
    return segments
