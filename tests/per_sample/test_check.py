"""The check's own parts (grab_exp.per_sample.check): its schedule, its weights, the loss split
kept on the device (CUDA's path, exercised with CPU tensors) and what :func:`kept_state` puts
back. The check's verdicts on models are tested in ``test_adversarial.py``."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from grab_exp.per_sample.check.schedule import Check
from grab_exp.per_sample.check.state import kept_state
from grab_exp.per_sample.modules import LossContractError


def test_the_schedule_checks_powers_of_two_then_every_period_and_every_new_kind_of_batch():
    check = Check(every=16)
    seen = []
    for n in range(1, 41):
        key = "long" if n >= 20 else "short"
        if check.due(key, batch=8):
            check.passed(key, batch=8)
            seen.append(n)
    assert seen == [1, 2, 4, 8, 16, 20, 32]  # 20: a new kind of batch


def test_a_batch_of_one_leaves_the_check_pending_until_a_batch_of_two():
    check = Check(every=16)
    assert check.due("one", batch=1)
    check.passed("one", batch=1)
    check.calls = 2  # the next call, 3, is not scheduled
    assert not check.due("one", batch=1)
    assert check.due("one", batch=2)  # call 4 is, but call 3 with two examples already was due
    check.calls = 4
    assert check.due("one", batch=2)  # no batch of two or more checked yet (call 5)


def test_every_zero_checks_nothing():
    check = Check(every=0)
    assert not any(check.due(k, batch=8) for k in range(10))
    assert check.split(8) is None


def test_the_weights_are_positive_distinct_and_leave_the_global_generator_alone():
    state = torch.get_rng_state()
    check = Check()
    c = check.weights(16, torch.empty(0, dtype=torch.float32))
    assert torch.equal(torch.get_rng_state(), state)
    assert c.dtype == torch.float32 and ((c >= 0.5) & (c < 1.5)).all()
    assert len(set(c.tolist())) == 16
    assert torch.equal(c, Check().weights(16, c))  # seeded: the same check, the same weights


def test_the_split_point_moves_from_call_to_call():
    check = Check()
    points = set()
    for _ in range(8):
        check.due("k", batch=6)
        points.add(check.split(6))
    assert points == {1, 2, 3, 4, 5}


def test_loss_splits_kept_on_the_device_are_refused_at_the_next_full_check():
    check = Check()
    check.settle_gap(torch.tensor(1e-7), torch.float32)  # rounding: kept, not read
    check.settle_gap(torch.tensor(0.5), torch.float32)  # a weighted loss
    check.settle_gap(torch.tensor(0.0), torch.float32)
    since = r"^loss_fn of a batch since the last check .*\(5e\+03 times the tolerance"
    with pytest.raises(LossContractError, match=since):
        check.settle_deferred()
    check.settle_gap(torch.tensor(float("nan")), torch.float32)  # an all-padding part
    with pytest.raises(LossContractError):
        check.settle_deferred()
    check.settle_gap(torch.tensor(1e-7), torch.float32)
    check.settle_gap(torch.tensor(1e-2), torch.bfloat16)  # bfloat16 outputs' gradients: rounding
    check.settle_deferred()  # within rounding: nothing raised, nothing kept
    check.settle_deferred()


class Counter(nn.Module):
    """Buffers updated in place and assigned anew by its forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("steps", torch.zeros(()))
        self.register_buffer("mean", torch.zeros(3))

    def forward(self, x):
        self.steps = self.steps + 1  # assigned anew
        self.mean.mul_(0.5).add_(x.mean(0))  # in place
        return x * 2


def test_kept_state_puts_back_buffers_modes_grads_and_the_generator():
    model = Counter()
    model.train()
    steps, mean = model.steps, model.mean.clone()
    grad = torch.ones(3)
    probe = nn.Parameter(torch.zeros(3))
    model.probe = probe
    probe.grad = grad
    state = torch.get_rng_state()
    with kept_state(model) as changed:
        model(torch.randn(4, 3))
        model.eval()
        probe.grad = None
        assert sorted(changed()) == ["mean", "steps"]
    assert model.steps is steps and torch.equal(model.mean, mean)
    assert model.training and probe.grad is grad
    assert torch.equal(torch.get_rng_state(), state)


class Triplet(nn.Module):
    """One encoder of an anchor, a positive and a negative: under ``triplet_margin_loss`` its
    last bias moves all three alike, so its gradient cancels to 0 (rounding of the others')."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 4))

    def forward(self, a, p, n):
        return self.enc(a), self.enc(p), self.enc(n)


def triplet_loss(out, y):
    return torch.nn.functional.triplet_margin_loss(*out, margin=1.0)


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "func", "loop"])
def test_a_gradient_that_cancels_to_zero_is_not_refused_in_float64(method: str) -> None:
    """The rows' mean check's floor times its tolerance is far above float64's epsilon (at
    c705d61, 1e-16 of the largest gradient: 20 calls refused this model on every method)."""
    from grab_exp.per_sample import make_per_sample

    torch.manual_seed(0)
    model, g = Triplet().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, triplet_loss, method)
    for size in [5, 8, 1, 7, *[6] * 16]:
        x = tuple(torch.randn(size, 6, generator=g, dtype=torch.float64) for _ in range(3))
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, torch.zeros(size))
        rows = grads.as_dict()["enc.0.weight"]  # (B, 8, 6)
        for i in range(size):
            one = tuple(t[i : i + 1] for t in x)
            want = torch.autograd.grad(triplet_loss(model(*one), None), model.enc[0].weight)[0]
            torch.testing.assert_close(rows[i], want)
    assert psg.method == method or psg.method in ("hooks", "factored")
