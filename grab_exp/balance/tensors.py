"""Input handling for ``Balance.step``: row counts, flattening, dtypes."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

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
    rows = int(_first_tensor(grads).shape[0])
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
    """
    if isinstance(grads, Mapping):
        rows = _first_tensor(grads).shape[0]
        if any(g.shape[0] != rows for g in grads.values()):
            raise ValueError("step: the tensors of the grads dict have different row counts")
        parts = [g.reshape(rows, -1) for g in grads.values()]
        _check_width(sum(p.shape[1] for p in parts), d)
        buffer = out(rows) if out is not None and len(parts) > 1 else None
        fits = buffer is not None and all(
            p.dtype == buffer.dtype and p.device == buffer.device for p in parts
        )
        if fits:
            return torch.cat(parts, dim=1, out=buffer)  # (B, d)
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)  # (B, d)
    flat = grads.reshape(grads.shape[0], -1)  # (B, d)
    _check_width(flat.shape[1], d)
    return flat


def _check_width(width: int, d: int) -> None:
    if width != d:
        raise ValueError(f"step: got {width} gradient values per example; expected d={d}")
