""":class:`BatchGrads`, what every per-sample path returns and an ordering's ``step`` reads: the
``(B, d)`` gradients (``named_parameters`` order) as column blocks, each a ``GradRows``: a dense
``(B, w)`` matrix, a Linear layer's factors or an Embedding's compact rows. A user's dict from
``torch.func.vmap(grad(...))`` or a ``(B, d)`` tensor becomes one through :func:`as_batch_grads`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from itertools import accumulate, pairwise

import torch

from grab_exp.devices import same_device
from grab_exp.grads.linear import FactorBias, LinearFactors
from grab_exp.grads.rows import DenseRows, GradRows, kept_view

#: what a per-sample path gives per parameter: ``(B, *shape)``, or a compact form (a Linear
#: layer's factors, an Embedding's :class:`~grab_exp.grads.embedding.EmbeddingRows`)
Part = torch.Tensor | GradRows | FactorBias
#: dense blocks narrower than this are joined with their dense neighbours into one matrix
JOIN_WIDTH = 1 << 16


class BatchGrads(GradRows):
    """``B`` per-sample gradients of ``d`` values: column blocks over the named parameters.

    The :class:`~grab_exp.grads.rows.GradRows` operations run block by block on each block's
    columns; materializing is explicit: :meth:`dense` (``(B, d)``), :meth:`as_dict`.

    Args:
        blocks: consecutive column blocks whose widths add up to ``d``.
        shapes: trainable parameter name -> shape, in ``named_parameters`` order (``{"": (d,)}``
            for a bare matrix).
    """

    def __init__(self, blocks: list[GradRows], shapes: dict[str, torch.Size]) -> None:
        self.blocks, self.shapes = blocks, shapes
        self.like = blocks[0].like
        self.rows = blocks[0].rows
        self.width = sum(shape.numel() for shape in shapes.values())
        self.factored = any(block.factored for block in blocks)
        self.columns = _column_slices(tuple(block.width for block in blocks))
        if self.columns[-1].stop != self.width:
            raise ValueError(
                f"BatchGrads: blocks of {self.columns[-1].stop} columns for d={self.width}"
            )

    @classmethod
    def from_parts(cls, parts: Mapping[str, Part], shapes: dict[str, torch.Size]) -> BatchGrads:
        """Blocks from per-parameter parts (``named_parameters`` order).

        A Linear layer's :class:`~grab_exp.grads.linear.FactorBias` right after its factors joins
        them (``bias=True``); runs of narrow dense parts are joined into one ``(B, w)`` matrix
        (one GEMM, not one per parameter), and so are consecutive column blocks of one
        row-major matrix (a reused buffer's views: no copy).
        """
        blocks: list[GradRows] = []
        run: list[torch.Tensor] = []  # dense parts waiting to be joined, as (B, w)
        for part in parts.values():
            last = blocks[-1] if blocks and not run else None
            if isinstance(part, FactorBias) and last is not None and last is part.factors:
                blocks[-1] = LinearFactors(part.factors.a, part.factors.delta, bias=True)
                continue
            if isinstance(part, GradRows):  # a compact block of its own
                blocks += _joined(run)
                blocks.append(part)
                continue
            dense = part_rows(part)  # (B, w)
            if run and max(dense.shape[1], run[-1].shape[1]) >= JOIN_WIDTH:
                blocks += _joined(run)
            run.append(dense)
        return cls(blocks + _joined(run), shapes)

    def to(self, device: torch.device, dtype: torch.dtype) -> BatchGrads:
        """The blocks on ``device`` in ``dtype`` (``self`` when they are there already)."""
        if same_device(self.like.device, device) and self.like.dtype == dtype:
            return self
        return BatchGrads([block.to(device, dtype) for block in self.blocks], self.shapes)

    @property
    def is_matrix(self) -> bool:
        """Whether the gradients are one dense block: :meth:`dense` is then a view, no copy."""
        return len(self.blocks) == 1 and not self.factored

    def dense(self, out: torch.Tensor | None = None) -> DenseRows:
        """The ``(B, d)`` matrix: the one dense block's own (no copy), else written into
        ``out (B, d)`` (or a new tensor)."""
        if self.is_matrix:
            return self.blocks[0].dense(out)
        out = self.like.new_empty(self.rows, self.width) if out is None else out
        self.write(out)
        return DenseRows(out)

    def as_dict(self) -> dict[str, torch.Tensor]:
        """Name -> ``(B, *shape)``: views of the materialized blocks (factored ones anew)."""
        grads, names = {}, iter(self.shapes.items())
        for block in self.blocks:
            matrix = block.materialize()  # (B, w)
            start = 0
            while start < block.width:
                name, shape = next(names)
                grads[name] = matrix[:, start : start + shape.numel()].view(self.rows, *shape)
                start += shape.numel()
        return grads

    def parts(self) -> list[torch.Tensor]:
        """One ``(B, d_i)`` matrix per parameter (see :meth:`as_dict`)."""
        return [g.reshape(self.rows, -1) for g in self.as_dict().values()]

    # --- GradRows: each block on its own columns ------------------------------------------
    def dots(self, acc):
        total = None
        for columns, block in zip(self.columns, self.blocks, strict=True):
            dots = block.dots(_columns(acc, columns))  # (B,) or (B, K)
            total = dots if total is None else total.add_(dots)
        return total

    def gram(self):
        first, *rest = (block.gram() for block in self.blocks)  # (B, B) each
        if not rest:
            return first
        total = first + rest[0]  # out of place: a block may keep its own Gram matrix
        for gram in rest[1:]:
            total.add_(gram)
        return total

    def accumulate(self, acc, coef, skip: frozenset[str] = frozenset()):
        """:meth:`GradRows.accumulate`; with ``skip``, into ``acc (d,)`` without the columns of
        the parameters it names (each in a dense block)."""
        if not skip:
            for columns, block in zip(self.columns, self.blocks, strict=True):
                block.accumulate(_columns(acc, columns), coef)
            return
        widths = tuple(block.width for block in self.blocks)
        params = tuple((n, shape.numel()) for n, shape in self.shapes.items())
        kept = _kept_columns(widths, params, skip)
        for columns, block, pieces in zip(self.columns, self.blocks, kept, strict=True):
            if pieces == (columns,):
                block.accumulate(acc[columns], coef)
                continue
            if not isinstance(block, DenseRows):
                raise ValueError(f"BatchGrads.accumulate: skip={sorted(skip)} is not dense")
            for piece in pieces:  # the block's kept columns
                local = slice(piece.start - columns.start, piece.stop - columns.start)
                acc[piece].addmv_(block.matrix[:, local].T, coef)

    def write(self, out):
        for columns, block in zip(self.columns, self.blocks, strict=True):
            block.write(_columns(out, columns))

    def centered_into(self, base, out):
        for columns, block in zip(self.columns, self.blocks, strict=True):
            block.centered_into(_columns(base, columns), _columns(out, columns))
        return DenseRows(out)

    def write_row(self, i, out):
        for columns, block in zip(self.columns, self.blocks, strict=True):
            block.write_row(i, _columns(out, columns))


def part_rows(part: Part) -> torch.Tensor:
    """A part's rows as a ``(B, w)`` matrix: a tensor's own (a view where it can be), a
    :class:`~grab_exp.grads.linear.FactorBias`'s bias rows, a compact block materialized."""
    if isinstance(part, FactorBias):
        part = part.factors.bias_grads()  # (B, out)
    elif isinstance(part, GradRows):
        part = part.materialize()  # (B, w)
    return part.reshape(part.shape[0], -1)


@functools.cache
def _column_slices(widths: tuple[int, ...]) -> tuple[slice, ...]:
    """The columns of consecutive blocks of these widths (one layout per model: made once)."""
    starts = list(accumulate(widths, initial=0))
    return tuple(slice(a, b) for a, b in pairwise(starts))


@functools.cache
def _kept_columns(
    widths: tuple[int, ...], params: tuple[tuple[str, int], ...], skip: frozenset[str]
) -> tuple[tuple[slice, ...], ...]:
    """Per block of these ``widths``, its column ranges outside the ``params`` (name, width)
    named in ``skip`` (one layout and skip per model: made once)."""
    columns = _column_slices(tuple(w for _, w in params))
    kept = [c for (n, _), c in zip(params, columns, strict=True) if n not in skip]
    return tuple(
        _merged([c for c in kept if block.start <= c.start < block.stop])
        for block in _column_slices(widths)
    )


def _merged(pieces: list[slice]) -> tuple[slice, ...]:
    """Adjacent column ranges joined."""
    merged: list[slice] = []
    for piece in pieces:
        if merged and merged[-1].stop == piece.start:
            merged[-1] = slice(merged[-1].start, piece.stop)
        else:
            merged.append(piece)
    return tuple(merged)


def _columns(tensor: torch.Tensor, columns: slice) -> torch.Tensor:
    """``tensor[..., columns]``, kept on ``tensor`` if it keeps its views."""
    return kept_view(tensor, (columns.start, columns.stop), lambda: tensor[..., columns])


def _joined(run: list[torch.Tensor]) -> list[DenseRows]:
    """The dense parts of ``run`` as one block (emptying ``run``): their own matrix when they are
    consecutive column blocks of one (a reused buffer), else a concatenation."""
    if not run:
        return []
    matrix = run[0] if len(run) == 1 else _joint_matrix(run)
    matrix = torch.cat(run, dim=1) if matrix is None else matrix  # (B, w)
    run.clear()
    return [DenseRows(matrix)]


def as_batch_grads(grads: torch.Tensor | Mapping[str, torch.Tensor] | BatchGrads) -> BatchGrads:
    """A :class:`BatchGrads` from what ``step`` takes: itself, a ``(B, ...)`` tensor or a dict
    name -> ``(B, ...)`` (``named_parameters`` order, e.g. ``vmap(grad(...))``'s).

    The dict's tensors are one block each, unless they are consecutive column blocks of one
    row-major matrix (one block, no copy); nothing is copied.

    Raises:
        ValueError: an empty dict, or tensors with different row counts.
    """
    if isinstance(grads, BatchGrads):
        return grads
    if not isinstance(grads, Mapping):
        grads = {"": grads}
    if not grads:
        raise ValueError("step: grads is an empty dict; expected name -> (B, ...) tensors")
    rows = next(iter(grads.values())).shape[0]
    if any(g.shape[0] != rows for g in grads.values()):
        raise ValueError("step: the tensors of the grads dict have different row counts")
    parts = [g.reshape(rows, -1) for g in grads.values()]  # (B, d_i) each
    whole = _joint_matrix(parts)
    blocks = [DenseRows(p) for p in parts] if whole is None else [DenseRows(whole)]
    return BatchGrads(blocks, {name: g.shape[1:] for name, g in grads.items()})


def rows_of(
    grads: torch.Tensor | Mapping[str, torch.Tensor] | BatchGrads | None,
    indices: torch.Tensor | None,
    required: bool,
) -> int:
    """Number of examples ``B`` in one step, checked for consistency.

    Raises:
        ValueError: grads missing where required, or grads/indices row counts differ.
    """
    if grads is None:
        if required:
            raise ValueError("step: grads is required by this ordering; got None")
        if indices is None:
            raise ValueError("step: pass grads or indices so the sampler knows the row count")
        return int(indices.numel())
    rows = as_batch_grads(grads).rows
    if indices is not None and int(indices.numel()) != rows:
        raise ValueError(f"step: grads have {rows} rows but indices has {indices.numel()}")
    return rows


def flatten_grads(
    grads: torch.Tensor | Mapping[str, torch.Tensor] | BatchGrads, d: int
) -> torch.Tensor:
    """Per-sample gradients as one ``(B, d)`` matrix (a view when they are one already).

    Args:
        grads: what :func:`as_batch_grads` takes.
        d: expected number of values per example.
    """
    grads = as_batch_grads(grads)
    _check_width(grads.width, d)
    return grads.dense().matrix


def grad_rows(
    grads: torch.Tensor | Mapping[str, torch.Tensor] | BatchGrads,
    d: int,
    device: torch.device,
    dtype: torch.dtype,
    projection: Callable[[list[torch.Tensor]], torch.Tensor] | None = None,
    out: Callable[[int], torch.Tensor] | None = None,
    keep_factors: bool = True,
) -> GradRows:
    """One step's gradients as the ``GradRows`` a balance variant reads, on ``device``/``dtype``.

    Factored gradients stay factored unless ``keep_factors`` is false (the variant reads no
    factors); anything else becomes the ``(B, d)`` matrix, written into the buffer ``out(B)``
    unless it is one matrix already, or, with a ``projection``, its ``(B, k)`` sketch built part
    by part (factors are materialized per parameter for it).
    """
    grads = as_batch_grads(grads)
    _check_width(grads.width, d)
    if projection is not None:  # (B, k) straight from the parts: no (B, d) copy
        return DenseRows(projection(grads.parts()).to(device, dtype))
    grads = grads.to(device, dtype)
    if keep_factors and grads.factored:
        return grads
    return grads.dense(None if out is None or grads.is_matrix else out(grads.rows))


def _joint_matrix(parts: list[torch.Tensor]) -> torch.Tensor | None:
    """The row-major ``(B, w)`` matrix whose consecutive column blocks are ``parts``, or None.

    Metadata only (pointers, strides): no data is read, nothing waits for the device.
    """
    first = parts[0]
    rows = first.shape[0]
    if first.numel() == 0:
        return None
    width = sum(part.shape[1] for part in parts)
    storage = first.untyped_storage().data_ptr()
    size = first.element_size()
    pointer = first.data_ptr()
    for part in parts:
        if (
            part.shape[1] == 0
            or part.dtype != first.dtype
            or part.device != first.device
            or part.data_ptr() != pointer
            or part.untyped_storage().data_ptr() != storage
            or (part.shape[1] > 1 and part.stride(1) != 1)
            or (rows > 1 and part.stride(0) != width)
        ):
            return None
        pointer += part.shape[1] * size
    return first.as_strided((rows, width), (width, 1))  # (B, w)


def _check_width(width: int, d: int) -> None:
    if width != d:
        raise ValueError(
            f"step: got {width} gradient values per example; expected d={d}, the trainable "
            "values the ordering was built for (a parameter frozen, unfrozen or replaced since "
            "changes them: build the sampler or ordering again)"
        )
