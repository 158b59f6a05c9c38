"""The CPU sync guard (``tests/support/sync_guard.py``): it refuses each kind of operator that
synchronizes on CUDA, and lets the sync-free ones that the orderings and the step use run."""

from __future__ import annotations

import pytest
import torch
from support.sync_guard import HostSyncError, SyncGuard
from torch.func import grad, vmap

W = torch.arange(12.0).reshape(3, 4)
ROWS = torch.arange(3)


def _indexed_write_of_a_number(w):
    w[ROWS, ROWS] = -1.0


def _indexed_write_of_a_host_tensor(w):
    w[ROWS, ROWS] = torch.tensor(2.0)


def _mask_write(w):
    w[w > 5] = 0.0


SYNCS = {
    "item": lambda w: w.sum().item(),
    "bool": lambda w: bool(w.sum() > 0),
    "if_tensor": lambda w: 1 if (w > 0).any() else 0,
    "int": lambda w: int(w[0, 1]),
    "nonzero": lambda w: w.nonzero(),
    "where_one_argument": lambda w: torch.where(w > 5),
    "mask_read": lambda w: w[w > 5],
    "mask_write": _mask_write,
    "masked_select": lambda w: w.masked_select(w > 5),
    "unique": lambda w: torch.unique(w),
    "bincount": lambda w: torch.bincount(ROWS),
    "repeat_interleave": lambda w: torch.repeat_interleave(w[0], ROWS.repeat(2)[:4]),
    "equal": lambda w: torch.equal(w, w),
    "indexed_write_of_a_number": _indexed_write_of_a_number,
    "indexed_write_of_a_host_tensor": _indexed_write_of_a_host_tensor,
}


def _loss(w, x):
    return (x @ w).square().sum()


def _sync_free(w):
    w.scatter_(1, ROWS[:, None], -1.0)  # a Python number as the scatter value
    w[ROWS, ROWS] = w[ROWS, ROWS + 1] * 2  # an indexed write of device values
    w[:2] = 1.0  # a slice fill
    w.index_add_(0, ROWS, torch.ones_like(w))
    x = w[ROWS.flip(0)]  # integer indexing
    torch.where(x > 2, x, torch.zeros_like(x))  # the three-argument where
    torch.repeat_interleave(x[0, :3], ROWS + 1, output_size=6)
    p = w.clone().requires_grad_()
    (p @ p.T).sum().backward()  # autograd's backward
    vmap(grad(_loss), in_dims=(None, 0))(w, torch.randn(5, 2, 3))  # per-sample gradients
    return p.grad


@pytest.mark.parametrize("name", sorted(SYNCS))
def test_each_kind_of_sync_is_refused(name):
    with pytest.raises(HostSyncError, match=r"synchronizes on CUDA"), SyncGuard():
        SYNCS[name](W.clone())


def test_sync_free_operators_run():
    with SyncGuard():
        guarded = _sync_free(W.clone())
    assert torch.equal(guarded, _sync_free(W.clone()))  # and compute what they compute unguarded


def test_named_host_tensors_may_be_read():
    count = torch.zeros((), dtype=torch.long)
    with SyncGuard(host_tensors=[count]):
        count += 1
        assert count.item() == 1
    with pytest.raises(HostSyncError), SyncGuard(host_tensors=[count]):
        (count + 1).item()  # a new tensor computed from it is a device value
