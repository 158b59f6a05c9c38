"""What the orderings keep between steps to save work (views of their accumulators, constant
tensors, Gram matrices) never changes a result and never outlives them."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch
from support.helpers import BALANCES, make, random_grads, run_epochs
from torch import nn
from torch.nn import functional as F

from grab_exp.grads import BatchGrads, DenseRows
from grab_exp.grads.rows import constant
from grab_exp.per_sample import make_per_sample


def lenet_like_grads(batch: int = 4) -> tuple[BatchGrads, int]:
    """Factored per-sample gradients of a small conv + Linear model (dense and factored blocks)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 2, 3), nn.Flatten(), nn.Linear(2 * 6 * 6, 5))
    psg = make_per_sample(model, F.cross_entropy, "factored")
    x, y = torch.randn(batch, 3, 8, 8), torch.randint(0, 5, (batch,))
    _, grads = psg(x, y)
    return grads, sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("name", BALANCES)
def test_an_ordering_and_its_buffers_are_freed_when_dropped(name):
    grads, d = lenet_like_grads()
    ordering = make(name, 8, d, batch_size=4, depth=3)
    ordering.step(grads)
    ordering.step(grads.dense().matrix)  # the dense path's scratch too
    kept = [getattr(ordering, k) for k in ordering.state_tensors]
    kept += list(ordering._scratch_buffers.values())
    refs = [weakref.ref(t._base if t._base is not None else t) for t in kept]
    refs.append(weakref.ref(ordering))
    del ordering, kept
    gc.collect()
    assert all(ref() is None for ref in refs)


def test_constants_and_kept_views_never_change_a_later_result():
    zs = random_grads(32, 7, epochs=3, seed=4)
    first = {n: run_epochs(make(n, 32, 7, depth=3, dtype="float64"), zs, 4) for n in BALANCES}
    again = {n: run_epochs(make(n, 32, 7, depth=3, dtype="float64"), zs, 4) for n in BALANCES}
    assert first == again
    for value in (0.0, 1.0, -1.0):
        for count in (1, 5, 6):
            assert torch.all(constant(value, count, torch.float64, torch.device("cpu")) == value)


def test_the_gram_matrix_of_a_batch_is_the_same_when_asked_twice():
    grads, _ = lenet_like_grads()
    dense = DenseRows(grads.dense().matrix.clone())
    halves = [DenseRows(dense.matrix[:, :10]), DenseRows(dense.matrix[:, 10:])]
    batch = BatchGrads(halves, {"": torch.Size([dense.width])})
    want = dense.matrix @ dense.matrix.T
    for rows in (grads, batch):
        assert torch.allclose(rows.gram(), want, rtol=1e-5, atol=1e-6)
        assert torch.allclose(rows.gram(), want, rtol=1e-5, atol=1e-6)  # no block changed
        assert torch.allclose(rows.blocks[0].gram(), rows.blocks[0].gram())
