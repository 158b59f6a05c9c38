"""A narrow ``Conv2d`` on the CPU is recorded as one convolution grouped by example over its
weight copied per example (``Conv2dRule.copy_weight``): the one ``loss.backward()`` then gives the
weight's rows and, through the copy, ``weight.grad``. Against a per-example loop over several
batches; the layer's own forward is back after every call."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

import grab_exp.per_sample.rules.conv2d as conv2d
from grab_exp.per_sample import UnsupportedModelError, make_per_sample


class Narrow(nn.Module):
    """Two narrow convolutions (3 and 4 input channels) and a head; ``how`` varies the calls."""

    def __init__(self, how: str) -> None:
        super().__init__()
        bias = how != "no_bias"
        self.a = nn.Conv2d(3, 4, 3, stride=2 if how == "strided" else 1, bias=bias)
        self.b = nn.Conv2d(4, 4, 3, padding="same", dilation=2 if how == "dilated" else 1)
        self.head = nn.Linear(4, 5)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, 5)
        h = checkpoint(self.a, x, use_reentrant=False) if self.how == "checkpoint" else self.a(x)
        h = torch.tanh(h)
        h = self.b(self.b(h)) if self.how == "twice" else self.b(h)
        if self.how == "no_grad_call":
            with torch.no_grad():
                extra = self.b(h)
            h = h + 0.1 * extra
        return self.head(h.mean((2, 3)))


HOWS = ["plain", "strided", "dilated", "no_bias", "twice", "checkpoint", "no_grad_call", "frozen"]


def reference(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each example's gradient of its own loss, one at a time: ``{name: (B, *shape)}``."""
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    rows = [
        torch.autograd.grad(
            F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]), list(params.values())
        )
        for i in range(len(y))
    ]
    return {n: torch.stack([r[k] for r in rows]) for k, n in enumerate(params)}


@pytest.mark.parametrize("how", HOWS)
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_rows_and_grad_over_batches_equal_a_per_example_loop(how: str, method: str) -> None:
    torch.manual_seed(0)
    model = Narrow(how).double()
    if how == "frozen":
        model.a.weight.requires_grad_(False)
    plain = copy.deepcopy(model)
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    for batch in (4, 1, 7, 4):
        x = torch.randn(batch, 3, 9, 9, generator=generator, dtype=torch.float64)
        y = torch.randint(0, 5, (batch,), generator=generator)
        model.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        F.cross_entropy(plain(x), y).backward()
        want = reference(plain, x, y)
        for name, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want[name], rtol=1e-9, atol=1e-12)
        for (name, p), q in zip(model.named_parameters(), plain.parameters(), strict=True):
            assert (p.grad is None) == (q.grad is None), name
            if p.grad is not None:
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12)
        assert not any("_conv_forward" in vars(m) for m in model.modules())


def test_the_rows_come_from_the_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the grouped weight gradient of the rows' own pass out of reach, the rows are still
    right: they are the copies' gradient from the one backward."""

    def unreachable(*args):
        raise AssertionError("the weight's rows were computed again")

    monkeypatch.setattr(conv2d, "grouped_weight_grads", unreachable)
    test_rows_and_grad_over_batches_equal_a_per_example_loop("plain", "hooks")


def test_the_layers_forward_is_back_after_a_call_that_raises() -> None:
    torch.manual_seed(0)
    model = Narrow("plain")
    psg = make_per_sample(model, F.cross_entropy, "hooks")
    x, y = torch.randn(3, 3, 9, 9), torch.tensor([0, 1, 9])  # target 9 of 5 classes
    with pytest.raises((UnsupportedModelError, IndexError, RuntimeError)):
        psg(x, y)
    assert not any("_conv_forward" in vars(m) for m in model.modules())
