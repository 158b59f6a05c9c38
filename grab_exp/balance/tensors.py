"""Input handling for ``Balance.step``: row counts, flattening, dtypes, index checks."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from grab_exp.balance.factored import FactoredGrads
from grab_exp.balance.rows import DenseRows, GradRows
from grab_exp.validation import check_choice

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def as_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` / ``torch.float64`` from a dtype or its name."""
    if isinstance(dtype, torch.dtype):
        check_choice("balance.dtype", str(dtype).removeprefix("torch."), DTYPES)
        return dtype
    check_choice("balance.dtype", dtype, DTYPES)
    return DTYPES[dtype]


def _first_tensor(grads: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
    if isinstance(grads, Mapping):
        if not grads:
            raise ValueError("step: grads is an empty dict; expected name -> (B, ...) tensors")
        return next(iter(grads.values()))
    return grads


def rows_of(
    grads: torch.Tensor | Mapping[str, torch.Tensor] | None,
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
    factored = isinstance(grads, FactoredGrads)  # its items materialize: read none
    rows = grads.rows if factored else int(_first_tensor(grads).shape[0])
    if indices is not None and int(indices.numel()) != rows:
        raise ValueError(f"step: grads have {rows} rows but indices has {indices.numel()}")
    return rows


def flatten_grads(
    grads: torch.Tensor | Mapping[str, torch.Tensor],
    d: int,
    out: Callable[[int], torch.Tensor] | None = None,
) -> torch.Tensor:
    """Per-sample gradients as one ``(B, d)`` matrix.

    Args:
        grads: ``(B, ...)`` tensor or dict name -> ``(B, ...)`` (concatenated in
            insertion order, i.e. ``model.named_parameters()`` order).
        d: expected number of values per example.
        out: optional ``rows -> (rows, d)`` buffer for the concatenation (a fresh
            multi-MB tensor every step costs page faults on the CPU).

    Parts that are consecutive column blocks of one row-major ``(B, d)`` matrix (what
    ``HookedPerSampleGradients(..., reuse_buffer=True)`` returns) come back as that matrix,
    a view: no copy.
    """
    parts = grad_parts(grads, d)
    if len(parts) == 1:
        return parts[0]  # (B, d)
    whole = _joint_matrix(parts, d)
    if whole is not None:
        return whole  # (B, d), shares memory with grads
    buffer = out(len(parts[0])) if out is not None else None
    fits = buffer is not None and all(
        p.dtype == buffer.dtype and p.device == buffer.device for p in parts
    )
    if fits:
        return torch.cat(parts, dim=1, out=buffer)  # (B, d)
    return torch.cat(parts, dim=1)  # (B, d)


def grad_rows(
    grads: torch.Tensor | Mapping[str, torch.Tensor],
    d: int,
    device: torch.device,
    dtype: torch.dtype,
    projection: Callable[[list[torch.Tensor]], torch.Tensor] | None = None,
    out: Callable[[int], torch.Tensor] | None = None,
    keep_factors: bool = True,
) -> GradRows:
    """One step's gradients as the ``GradRows`` a balance variant reads, on ``device``/``dtype``.

    :class:`~grab_exp.balance.factored.FactoredGrads` stay factored (written into the ``(B, d)``
    buffer instead when ``keep_factors`` is false: the variant reads no factors); anything else
    becomes the ``(B, d)`` matrix (:func:`flatten_grads`, ``out`` its buffer) or, with a
    ``projection``, its ``(B, k)`` sketch built part by part (factors are materialized per
    parameter for it).
    """
    if isinstance(grads, FactoredGrads) and projection is None:
        _check_width(grads.width, d)
        grads = grads.to(device, dtype)
        if keep_factors:
            return grads
        rows = grads.rows
        buffer = out(rows) if out is not None else grads.like.new_empty(rows, d)
        return grads.dense(buffer)  # (B, d)
    if projection is None:
        flat = flatten_grads(grads, d, out).to(device)  # (B, d)
    else:  # (B, k) straight from the dict's tensors: no (B, d) copy
        flat = projection(grad_parts(grads, d))
    return DenseRows(flat.to(dtype))


def grad_parts(grads: torch.Tensor | Mapping[str, torch.Tensor], d: int) -> list[torch.Tensor]:
    """Per-sample gradients as ``(B, d_i)`` views (no copy) whose widths add up to ``d``.

    Args:
        grads: ``(B, ...)`` tensor (one part) or dict name -> ``(B, ...)`` (one part each,
            in insertion order).
        d: expected number of values per example.
    """
    if not isinstance(grads, Mapping):
        grads = {"": grads}
    rows = _first_tensor(grads).shape[0]
    if any(g.shape[0] != rows for g in grads.values()):
        raise ValueError("step: the tensors of the grads dict have different row counts")
    parts = [g.reshape(rows, -1) for g in grads.values()]  # (B, d_i) each
    _check_width(sum(p.shape[1] for p in parts), d)
    return parts


def _joint_matrix(parts: list[torch.Tensor], d: int) -> torch.Tensor | None:
    """The row-major ``(B, d)`` matrix whose consecutive column blocks are ``parts``, or None.

    Metadata only (pointers, strides): no data is read, nothing waits for the device.
    """
    first = parts[0]
    rows = first.shape[0]
    if first.numel() == 0:
        return None
    storage = first.untyped_storage().data_ptr()
    size = first.element_size()
    pointer = first.data_ptr()
    for part in parts:
        width = part.shape[1]
        if (
            width == 0
            or part.dtype != first.dtype
            or part.device != first.device
            or part.data_ptr() != pointer
            or part.untyped_storage().data_ptr() != storage
            or (width > 1 and part.stride(1) != 1)
            or (rows > 1 and part.stride(0) != d)
        ):
            return None
        pointer += width * size
    return first.as_strided((rows, d), (d, 1))  # (B, d)


def _check_width(width: int, d: int) -> None:
    if width != d:
        raise ValueError(f"step: got {width} gradient values per example; expected d={d}")


class IndexCheck:
    """Counts ``step`` indices that differ from the order's next ones.

    On the CPU a mismatch raises at once; on CUDA the count stays on the device (no
    synchronization inside ``step``) until ``raise_if_bad`` (state_dict, next epoch).
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bad = torch.zeros((), dtype=torch.long, device=device)

    def add(self, indices: torch.Tensor, expected: torch.Tensor) -> None:
        """Count the mismatches of ``(B,)`` ``indices`` against ``(B,)`` ``expected``."""
        # non_blocking only host -> device: a device -> host copy is read at once below
        moved = indices.to(self.device, non_blocking=self.device.type == "cuda")
        self.bad += (moved.reshape(-1) != expected).sum()
        if self.device.type == "cpu":  # free to check now; on CUDA defer (no sync in step)
            self.raise_if_bad()

    def raise_if_bad(self) -> None:
        """Raise (and reset) when any index so far was not the expected one."""
        if self.bad.item():
            self.bad.zero_()
            raise ValueError(
                "step: indices are not the next ones of the current order; iterate the "
                "sampler (or index_batches) and step each batch once, in order"
            )
