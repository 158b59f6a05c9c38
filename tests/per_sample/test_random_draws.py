"""Random numbers a model draws itself, outside Dropout modules (``torch.randn_like``,
``F.dropout``), round 19: inside a layer the hook path replays (refused: a replay per example
cannot draw as the batch did), between layers (the hook path is right: each layer reads the
batch's own draws), and on ``loop`` (refused: each example alone draws other numbers). ``auto``
gives ``func`` ``randomness="different"``: a draw per example."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from support.plain_step import assert_a_plain_step_from_one_seed
from torch import nn

from grab_exp.per_sample import UnsupportedModelError, make_per_sample


class Noisy(nn.Module):
    """A layer without a rule that adds noise (``dropout``: drops) inside its forward, in training
    mode."""

    def __init__(self, dropout: bool) -> None:
        super().__init__()
        self.weight, self.dropout = nn.Parameter(0.4 * torch.randn(6, 6)), dropout

    def forward(self, x):
        if self.dropout:
            return torch.tanh(F.dropout(x, 0.3, self.training) @ self.weight)
        h = x @ self.weight
        return torch.tanh(h + 0.3 * torch.randn_like(h) if self.training else h)


class NoisyBetween(nn.Module):
    """Tokens plus positions of ``arange(T)`` (expanded on the hook path), then noise or a
    functional dropout between the embeddings and the head, in training mode."""

    def __init__(self, dropout: bool) -> None:
        super().__init__()
        self.tok, self.pos, self.head = nn.Embedding(9, 6), nn.Embedding(8, 6), nn.Linear(6, 4)
        self.dropout = dropout

    def forward(self, tokens):
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1]))  # (B, T, 6)
        if self.training:  # a dropout, or noise, in training mode only
            h = F.dropout(h, 0.3) if self.dropout else h + 0.3 * torch.randn_like(h)
        return self.head(torch.tanh(h).mean(1))


def tokens(g: torch.Generator, batch: int):
    return torch.randint(0, 9, (batch, 3), generator=g), torch.randint(0, 4, (batch,), generator=g)


@pytest.mark.parametrize("dropout", [False, True], ids=["noise", "dropout"])
@pytest.mark.parametrize("check_every", [0, 128])
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_replayed_layer_that_draws_random_numbers_is_refused(method, check_every, dropout):
    """vmap's refusal of a random operation was taken for a layer it cannot batch, and the
    replay one example at a time drew fresh numbers: rows 20-270 % off with check_every=0, the
    generator moved past a plain step's. The hook path refuses the layer, naming it; ``auto``
    takes ``func``, which draws per example."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), Noisy(dropout), nn.Linear(6, 3)).double()
    psg = make_per_sample(model, F.cross_entropy, method, check_every=check_every)
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0, 1])
    if method == "auto":
        psg(x, y)
        assert psg.method == "func" and "1 (Noisy): its forward draws random numbers" in psg.reason
        return
    with pytest.raises(UnsupportedModelError, match=r"^1 \(Noisy\): its forward draws random"):
        psg(x, y)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("dropout", [False, True], ids=["noise", "dropout"])
@pytest.mark.parametrize("method", ["hooks", "factored"])
def test_random_numbers_between_layers_are_the_batchs_own_on_the_hook_path(method, dropout):
    """Noise or a functional dropout between layers, with a position embedding the hook path
    expands: the probes drew other numbers each and the refusal named a spread over the copies
    (round 19, F4). Every probe now draws from one state of the generators, and the hook path is
    right: the loss and p.grad are a plain step's from the same state, over several batches."""
    torch.manual_seed(0)
    model, g = NoisyBetween(dropout).double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, F.cross_entropy, method)
    for step, batch in enumerate((4, 4, 1, 5, 4)):
        assert_a_plain_step_from_one_seed(psg, model, F.cross_entropy, *tokens(g, batch), step)
    assert psg.method == method


def test_loop_refuses_a_model_that_draws_random_numbers_itself():
    """``loop`` refused Dropout modules only: noise drawn in the forward gave each example alone
    other numbers than the batch's, silently with check_every=0 (rows 17-100 % off)."""
    torch.manual_seed(0)
    model, g = NoisyBetween(dropout=False).double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, F.cross_entropy, "loop", check_every=0)
    with pytest.raises(UnsupportedModelError, match=r"^the model draws random numbers in its "):
        psg(*tokens(g, 4))
    assert all(p.grad is None for p in model.parameters())
