"""A layer's parameters in another order, under another name, or fewer than its constructor gave
it: ``torch.nn.utils.prune.remove`` and ``remove_weight_norm`` register the weight again, after
the bias; a bias set to ``None``, a weight made a buffer. A rule's rows are ``[weight, bias]`` and
a layer's parameters are taken in that order; the rows are keyed by the parameters the model has
on each call (adversarial reviews 9 and 10: hooks and factored refused with a raw shape or
``zip()`` error or a false cause; loop kept a name the model no longer had, with zero rows)."""

from __future__ import annotations

import pytest
import torch
from fuzz.reference import reference
from torch import nn
from torch.nn import functional as F
from torch.nn.utils import prune

from grab_exp.per_sample import UnsupportedModelError, make_per_sample

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


class Small(nn.Module):
    """A Linear, a LayerNorm and a head: ``(B, 6) -> (B, 3)``."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.norm, self.head = nn.Linear(6, 5), nn.LayerNorm(5), nn.Linear(5, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.norm(self.a(x))))


def _bias_none(model: Small, call: int) -> None:
    if call == 2:
        model.a.bias = None


def _bias_none_then_again(model: Small, call: int) -> None:
    if call == 1:
        model.a.bias = None
    if call == 2:
        model.a.bias = nn.Parameter(torch.zeros(5, dtype=torch.float64))


def _weight_made_a_buffer(model: Small, call: int) -> None:
    if call == 2:
        weight = model.norm.weight.detach().clone()
        del model.norm.weight
        model.norm.register_buffer("weight", weight)


@pytest.mark.parametrize("change", [_bias_none, _bias_none_then_again, _weight_made_a_buffer])
@pytest.mark.parametrize("method", METHODS)
def test_a_parameter_removed_between_calls_is_gone_from_the_rows(change, method):
    torch.manual_seed(0)
    model = Small().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    for call in range(4):
        change(model, call)
        x = torch.randn(4, 6, generator=generator, dtype=torch.float64)
        _right(model, psg, x, torch.randint(0, 3, (4,), generator=generator), call)


class Blocks(nn.Module):
    """Three Linear blocks in an ``nn.ModuleList`` and a head."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks, self.head = nn.ModuleList(nn.Linear(6, 6) for _ in range(3)), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = torch.tanh(block(x))
        return self.head(x)


@pytest.mark.parametrize("method", METHODS)
def test_a_module_deleted_between_calls_is_gone_from_the_rows(method):
    """``del model.blocks[1]`` fires no registration hook, and the ``ModuleList`` renames the
    blocks after it: the rows kept the old names and the deleted block's zero rows under
    ``blocks.1`` (adversarial round 26; ``func`` raised an internal error)."""
    torch.manual_seed(0)
    model = Blocks().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    for call in range(4):
        if call == 2:
            del model.blocks[1]
        x = torch.randn(4, 6, generator=generator, dtype=torch.float64)
        _right(model, psg, x, torch.randint(0, 3, (4,), generator=generator), call)


@pytest.mark.parametrize("method", METHODS[1:])
def test_batch_statistics_switched_on_after_construction_are_a_refusal(method):
    """A BatchNorm put in training mode after ``make_per_sample``: an ``UnsupportedModelError``
    (round 26: a bare ``ValueError``, which ``except UnsupportedModelError`` missed)."""
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4), nn.Linear(4, 3)).double().eval()
    psg = make_per_sample(model, F.cross_entropy, method)
    model.train()
    x = torch.randn(4, 6, dtype=torch.float64)
    with pytest.raises(UnsupportedModelError, match=r"^1 \(BatchNorm1d\) in training mode"):
        psg(x, torch.tensor([0, 1, 2, 0]))
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("method", METHODS)
def test_an_empty_batch_is_refused_before_any_work(method):
    model = Small().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.zeros(0, 6, dtype=torch.float64), torch.zeros(0, dtype=torch.long)
    with pytest.raises(ValueError, match=r"^per-sample inputs of 0 examples .*one example or more"):
        psg(x, y)
    assert all(p.grad is None for p in model.parameters())
