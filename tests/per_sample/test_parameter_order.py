"""A layer's parameters in another order, or under another name, than its constructor gave them:
``torch.nn.utils.prune.remove`` and ``remove_weight_norm`` register the weight again, after the
bias. A rule's rows are ``[weight, bias]`` and a layer's parameters are taken in that order; the
rows are keyed by the names the model has on each call (an adversarial review: hooks and factored
refused with a raw shape error or a false cause, loop kept a name the model no longer had)."""

from __future__ import annotations

import pytest
import torch
from fuzz.reference import reference
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune

from grab_exp.per_sample import make_per_sample

METHODS = ["auto", "hooks", "factored", "func", "loop"]


def _weight_after_bias(layer: nn.Module) -> nn.Module:
    """``layer`` with its weight registered again, after its bias (``prune.remove``'s way)."""
    prune.identity(layer, "weight")
    prune.remove(layer, "weight")
    assert [n for n, _ in layer.named_parameters()] == ["bias", "weight"]
    return layer


class Net(nn.Module):
    """A convolution, a LayerNorm (weight and bias of one shape) and a Linear head."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.norm, self.head = nn.Conv2d(3, 4, 3), nn.LayerNorm(4), nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 5, 5) -> (B, 3)
        return self.head(self.norm(torch.tanh(self.conv(x)).mean((2, 3))))


def _right(model: nn.Module, psg, x: torch.Tensor, y: torch.Tensor, call: int) -> None:
    """One call's rows, keyed by the model's names now, and ``p.grad`` against the references."""
    model.zero_grad(set_to_none=True)
    _, grads = psg(x, y)
    rows = {n: r.clone() for n, r in grads.as_dict().items()}
    got = {n: p.grad.clone() for n, p in model.named_parameters()}
    want = reference(model, F.cross_entropy, x, y)
    assert list(rows) == list(want.rows), f"call {call}"
    for name, row in rows.items():
        torch.testing.assert_close(row, want.rows[name], rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(got[name], want.grads[name], rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("method", METHODS)
def test_rule_layers_whose_bias_comes_first_get_their_own_rows(method):
    torch.manual_seed(0)
    model = Net().double()
    for layer in (model.conv, model.norm, model.head):
        _weight_after_bias(layer)
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    for call, batch in enumerate((4, 1, 4, 5)):
        x = torch.randn(batch, 3, 5, 5, generator=generator, dtype=torch.float64)
        _right(model, psg, x, torch.randint(0, 3, (batch,), generator=generator), call)


@pytest.mark.parametrize("method", METHODS)
def test_a_parameter_renamed_between_calls_is_named_anew(method):
    """``prune.remove`` between calls registers ``weight_orig`` (the same ``Parameter``) as
    ``weight``: from that call on the rows are keyed ``weight``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)).double()
    prune.l1_unstructured(model[0], "weight", amount=0.4)
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    for call in range(4):
        if call == 2:
            prune.remove(model[0], "weight")
        x = torch.randn(4, 6, generator=generator, dtype=torch.float64)
        _right(model, psg, x, torch.randint(0, 3, (4,), generator=generator), call)
