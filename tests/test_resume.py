"""Exact resume: a state_dict saved mid-epoch, loaded into a fresh instance, continues
bit-identically to never stopping."""

from __future__ import annotations

import io

import pytest
import torch
from helpers import ALL_ORDERINGS, KERNELS, current_order, make, random_grads, run_epochs

N, D, B, EPOCHS = 37, 3, 4, 4


def build(name, kernel):
    return make(name, N, D, batch_size=B, depth=3, kernel=kernel, c=3.0, seed=7)


def step_range(bal, z, start, stop):
    order = bal.order.clone()
    for s in range(start, stop, B):
        bal.step(z[order[s : min(s + B, stop)]])


def snapshot(bal) -> bytes:
    buf = io.BytesIO()
    torch.save(bal.state_dict(), buf)
    return buf.getvalue()


def restore(bal, blob: bytes) -> None:
    bal.load_state_dict(torch.load(io.BytesIO(blob)))


def interrupted_run(name, kernel, zs, save_epoch, save_pos):
    """Run EPOCHS epochs, but at (save_epoch, save_pos) save, keep the old instance going a
    little (it must not affect the saved state), and continue in a fresh instance."""
    bal = build(name, kernel)
    orders = [current_order(bal)]
    for epoch, z in enumerate(zs):
        start = 0
        if epoch == save_epoch:
            step_range(bal, z, 0, save_pos)
            blob = snapshot(bal)
            step_range(bal, z, save_pos, N)  # the old instance runs on, then is dropped
            bal = build(name, kernel)
            restore(bal, blob)
            assert bal.epoch == epoch and current_order(bal) == orders[-1]
            start = save_pos
        step_range(bal, z, start, N)
        bal.set_epoch(epoch + 1)
        orders.append(current_order(bal))
    return orders


@pytest.mark.parametrize(("save_epoch", "save_pos"), [(1, 16), (0, 8), (2, 0), (3, 36)])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_ORDERINGS)
def test_mid_epoch_resume_is_bit_identical(name, kernel, save_epoch, save_pos):
    zs = random_grads(N, D, EPOCHS, seed=3)
    straight = run_epochs(build(name, kernel), zs, B)
    assert interrupted_run(name, kernel, zs, save_epoch, save_pos) == straight


@pytest.mark.parametrize("name", ["mean", "recursive", "recursive_pair"])
def test_resume_restores_the_generator_and_accumulators(name):
    """The state loaded into an instance that has run a different history (other gradients,
    later epoch) still continues exactly like the instance it was saved from."""
    zs = random_grads(N, D, EPOCHS, seed=4)
    a = build(name, "probabilistic")
    run_epochs(a, zs[:1], B)
    step_range(a, zs[1], 0, 12)
    blob = snapshot(a)
    b = build(name, "probabilistic")
    run_epochs(b, random_grads(N, D, 3, seed=5), B)
    step_range(b, zs[0], 0, 20)
    restore(b, blob)
    for bal in (a, b):
        step_range(bal, zs[1], 12, N)
        bal.set_epoch(2)
    assert run_epochs(a, zs[2:], B) == run_epochs(b, zs[2:], B)
