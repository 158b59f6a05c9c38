"""Small helpers shared by the balance variants: sequential signs and order keys."""

from __future__ import annotations

import numpy
import torch

from grab_exp.devices import host_reads_allowed

# Sort keys of positions that were stepped but not balanced, and of positions not
# stepped at all; both keep visit order and come after every balanced position.
UNBALANCED_KEY = 1 << 61
UNVISITED_KEY = 1 << 62


def sequential_signs(
    dots: torch.Tensor, gram: torch.Tensor, thresholds: torch.Tensor
) -> torch.Tensor:
    """Signs of vectors balanced one after another against a shared accumulator.

    Vector ``i`` is signed against ``acc_0 + sum_{j<i} s_j v_j`` where ``acc_0`` is
    the accumulator before the first vector, so its dot product is
    ``dots[i] + sum_{j<i} s_j gram[i, j]``. Only this scalar recursion is sequential.

    On the CPU it runs on the tensors' own memory through numpy (no copy; there is no device
    to wait for), about ten times faster than launching torch operators per vector; elsewhere
    it is a loop of three kernels per vector (:func:`device_signs`). Both give the same signs
    bit for bit: ``s_j v`` is exact, so each update rounds once either way.

    Args:
        dots: ``(B,)`` dot products ``<v_i, acc_0>``.
        gram: ``(B, B)`` inner products ``<v_i, v_j>`` (entries may be masked to 0
            where ``v_j`` does not share ``v_i``'s accumulator).
        thresholds: ``(B,)`` kernel thresholds (sign ``+`` iff dot < threshold).

    Returns:
        ``(B,)`` signs in ``{+1, -1}`` with the dtype of ``dots``.
    """
    if not host_reads_allowed(dots.device):
        return device_signs(dots, gram, thresholds)
    arrays = (t.detach().numpy() for t in (dots, gram, thresholds))
    return torch.from_numpy(host_signs(*arrays))


def host_signs(dots: numpy.ndarray, gram: numpy.ndarray, limits: numpy.ndarray) -> numpy.ndarray:
    """:func:`sequential_signs` on numpy arrays (the CPU's path): ``(B,)``, ``(B, B)``, ``(B,)``
    in, ``(B,)`` signs with the dtype of ``dots`` out."""
    running = dots.copy()  # (B,)
    columns = numpy.ascontiguousarray(gram.T)  # (B, B): row j is column j of gram
    signs = numpy.empty_like(running)  # (B,)
    for j, column in enumerate(columns):
        signs[j] = 1.0 if running[j] < limits[j] else -1.0
        running += signs[j] * column  # rows k > j see s_j <v_k, v_j>
    return signs


def device_signs(dots: torch.Tensor, gram: torch.Tensor, thresholds: torch.Tensor) -> torch.Tensor:
    """:func:`sequential_signs` as device kernels: 3 per vector, nothing allocated in the loop,
    no value read on the host (CUDA-graph capturable)."""
    running = dots.clone()  # (B,)
    signs = torch.empty_like(dots)  # (B,)
    below = torch.empty(dots.shape, dtype=torch.bool, device=dots.device)  # (B,)
    plus = torch.ones((), dtype=dots.dtype, device=dots.device)
    minus = -plus
    columns = gram.t().contiguous()  # (B, B): row j is column j of gram
    views = zip(
        columns.unbind(),
        running.unbind(),
        thresholds.unbind(),
        below.unbind(),
        signs.unbind(),
        strict=True,
    )
    for column, run, threshold, is_below, sign in views:
        torch.lt(run, threshold, out=is_below)
        torch.where(is_below, plus, minus, out=sign)
        running.addcmul_(column, sign)
    return signs


def sign_keys(positions: torch.Tensor, signs: torch.Tensor, n: int) -> torch.Tensor:
    """Sort keys that put ``+`` positions in visit order, then ``-`` ones reversed.

    Args:
        positions: ``(B,)`` visit positions in ``[0, n)``.
        signs: ``(B,)`` signs in ``{+1, -1}``.
        n: number of examples.

    Returns:
        ``(B,)`` int64 keys in ``[0, 2n)``.
    """
    return torch.where(signs > 0, positions, 2 * n - 1 - positions)


def pair_keys(positions: torch.Tensor, signs: torch.Tensor, n: int) -> torch.Tensor:
    """Sort keys of consecutive pairs: a pair's first member takes its sign ``s``, its second
    ``-s``.

    Args:
        positions: ``(2P,)`` visit positions of the pairs' members, pair after pair.
        signs: ``(..., P)`` the pairs' signs.
        n: number of examples.

    Returns:
        ``(..., 2P)`` int64 keys (see :func:`sign_keys`).
    """
    members = torch.stack([signs, -signs], dim=-1).flatten(-2)  # (..., 2P)
    return sign_keys(positions, members, n)
