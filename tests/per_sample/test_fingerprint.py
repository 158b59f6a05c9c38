"""A rule layer whose instance ``forward`` was replaced (``layer.forward = ...``) no longer computes
what its rule assumes: it is hooked with the per-layer fallback (a replay of its own forward),
whether the forward was replaced before construction or between calls (issue 49, item 5)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grab_exp.per_sample import make_per_sample
from grab_exp.per_sample.check.mean import known_cause

F64 = torch.float64
SIZES = (1, 5, 8)


def scaled(lin: nn.Linear):
    return lambda h: F.linear(h, 2 * lin.weight, lin.bias)


def flipped(lin: nn.Linear):
    """The batch flipped inside and back: still per example."""
    return lambda h: F.linear(h.flip(0), lin.weight, lin.bias).flip(0)


def example_rows(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Each example's own gradient, one ``autograd.grad`` at a time (float64)."""
    named = list(model.named_parameters())
    rows: dict[str, list] = {n: [] for n, _ in named}
    for i in range(len(x)):
        loss = F.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        for (n, _), g in zip(named, torch.autograd.grad(loss, [p for _, p in named]), strict=True):
            rows[n].append(g)
    return {n: torch.stack(r) for n, r in rows.items()}


def plain_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    model.zero_grad(set_to_none=True)
    F.cross_entropy(model(x), y).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return grads


@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
@pytest.mark.parametrize("replace", [scaled, flipped])
@pytest.mark.parametrize("when", ["before", "between"])
def test_a_replaced_forward_is_replayed_not_ruled(method: str, replace, when: str) -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), nn.Tanh(), nn.Linear(6, 3)).to(F64)
    if when == "before":
        model[2].forward = replace(model[2])
    psg = make_per_sample(model, F.cross_entropy, method)
    hooked = psg.chosen if method == "auto" else psg
    for call, size in enumerate(SIZES):
        if when == "between" and call == 1:
            model[2].forward = replace(model[2])
        x, y = torch.randn(size, 4, dtype=F64), torch.randint(0, 3, (size,))
        want_rows, want_grads = example_rows(model, x, y), plain_grads(model, x, y)
        loss, grads = psg(x, y)
        replaced = "forward" in vars(model[2])
        assert ("2" in hooked.registry.fallbacks) == replaced and (
            "2" in hooked.registry.rules
        ) != replaced
        torch.testing.assert_close(loss, F.cross_entropy(model(x), y).detach())
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want_rows[n], msg=f"call {call}: rows of {n}")
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, want_grads[n], msg=f"call {call}: grad of {n}")
        model.zero_grad(set_to_none=True)
    if method == "auto":
        assert psg.reason is None and psg.method in ("hooks", "factored")


def test_the_mean_check_names_a_replaced_forward() -> None:
    model = nn.Sequential(nn.Linear(4, 3))
    assert known_cause(model, "0.weight", model[0].weight) is None
    model[0].forward = scaled(model[0])
    assert "its forward was replaced on the instance" in known_cause(
        model, "0.weight", model[0].weight
    )
