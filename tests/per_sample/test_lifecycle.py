"""The hook path's hooks over a model's life in a training loop (adversarial round 37): a deep
copy made after ``make_per_sample`` (an EMA teacher used in the forward), ``torch.save`` of the
whole model, a new ``make_per_sample`` every epoch."""

from __future__ import annotations

import copy
import gc
import io
import pickle

import pytest
import torch
import torch.nn.functional as F
from test_weight_copies import reference
from torch import nn

from grab_exp.per_sample import make_per_sample


class Distilled(nn.Module):
    """A student whose output adds a frozen teacher's head on its own features; the teacher is a
    deep copy of the model kept in a list (not a registered module)."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 8), nn.ReLU())
        self.head = nn.Linear(8, 3)
        self.teacher: list[nn.Module] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.body(x)
        out = self.head(h)
        return out + 0.5 * self.teacher[0].head(h) if self.teacher else out


@pytest.mark.parametrize(
    ("method", "check_every"), [("auto", 128), ("auto", 0), ("hooks", 128), ("hooks", 0)]
)
def test_a_deep_copy_made_after_make_per_sample_is_not_recorded_as_the_model(method, check_every):
    """The copy carried the path's forward hooks, which recorded its head's call as the model's
    head's: rows 0.39-0.50 off with the check off, silently; refused naming a false cause on
    hooks ("re-indexes its batch"). The copy's hooks now do nothing."""
    torch.manual_seed(0)
    model = Distilled().double()
    psg = make_per_sample(model, F.cross_entropy, method, check_every=check_every)
    model.teacher = [copy.deepcopy(model).requires_grad_(False)]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x = torch.randn(5, 6, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (5,), generator=g)
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        want = reference(model, x, y)
        for name, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want[name], msg=name)
    assert psg.method in ("hooks", "factored")


@pytest.mark.parametrize("save", ["torch.save", "pickle"])
def test_a_model_with_the_paths_hooks_saves_and_loads(save: str) -> None:
    """``torch.save(model)`` raised "Can't pickle local object 'Recorder._forward_hook...'" after a
    call; the loaded model runs as a plain one and takes a new ``make_per_sample``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    psg = make_per_sample(model, F.cross_entropy)
    psg(x, y)
    if save == "pickle":
        loaded = pickle.loads(pickle.dumps(model))
    else:
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(loaded(x), model(x))
    loaded.zero_grad(set_to_none=True)
    _, grads = make_per_sample(loaded, F.cross_entropy)(x, y)
    want = reference(loaded, x, y)
    for name, rows in grads.as_dict().items():
        torch.testing.assert_close(rows, want[name], msg=name)


def test_the_hooks_go_with_their_psg() -> None:
    """A new ``make_per_sample`` every epoch stacked one more forward hook and pre-hook per layer
    (4 each after 4 epochs), and deleting the psg left them; ``auto`` had no ``remove()``."""
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    x, y = torch.randn(5, 4), torch.randint(0, 3, (5,))
    for _ in range(4):
        psg = make_per_sample(model, F.cross_entropy)
        psg(x, y)
        assert len(model[0]._forward_hooks) == len(model[0]._forward_pre_hooks) == 1
    del psg
    gc.collect()
    assert not model[0]._forward_hooks and not model[0]._forward_pre_hooks
    psg = make_per_sample(model, F.cross_entropy)
    psg.remove()
    assert not model[0]._forward_hooks and not model[0]._forward_pre_hooks
