"""Factored per-sample gradients against the materialized (B, d) matrix, through every ordering.

float64: the orders of 3 epochs are equal and the accumulators agree to 1e-10 relative, for every
variant, both kernels, ``normalize`` on and off, and lenet / mlp / logreg / a Transformer-style
model (Linear layers on (B, T, in) sequences) / a token model (an Embedding's compact rows). Both
paths feed the same per-sample gradients of a fixed model (no training), so any difference comes
from the representation.
"""

from __future__ import annotations

import pytest
import torch
from support.helpers import BALANCES, KERNELS, make
from test_balance_properties import discrepancy
from torch import nn
from torch.nn import functional as F

from grab_exp.grads import (
    BatchGrads,
    DenseRows,
    GradRows,
    LinearFactors,
    compact_pays,
    factor_pays,
)
from grab_exp.models import MLP, LeNet, LogReg
from grab_exp.optim import VRSGD
from grab_exp.per_sample import PerSamplePipeline, make_per_sample
from grab_exp.sampler import GraBSampler

N, B, EPOCHS = 24, 8, 3
RTOL = 1e-10


class TinyTransformer(nn.Module):
    """Token embedding by a Linear, LayerNorm, a one-head self-attention and an MLP block."""

    def __init__(self, width: int = 12, steps: int = 3, classes: int = 5) -> None:
        super().__init__()
        self.steps = steps
        self.embed = nn.Linear(8, width)
        self.norm = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.up = nn.Linear(width, 4 * width)
        self.down = nn.Linear(4 * width, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.embed(x.reshape(x.shape[0], self.steps, -1)[..., :8])  # (B, T, width)
        q, k, v = self.qkv(self.norm(h)).chunk(3, dim=-1)
        h = h + F.scaled_dot_product_attention(q, k, v)
        h = h + self.down(torch.relu(self.up(h)))
        return self.head(h.mean(dim=1))  # (B, classes)


class TokenModel(nn.Module):
    """Tokens (from the image's first values: a vocabulary of 11, T = 3, some repeated) through an
    Embedding, mean pooled, then a Linear head."""

    def __init__(self, vocab: int = 11, width: int = 4, classes: int = 5) -> None:
        super().__init__()
        self.vocab = vocab
        self.embed = nn.Embedding(vocab, width)
        self.head = nn.Linear(width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tokens = (x.reshape(x.shape[0], -1)[:, :3] * 1000).long() % self.vocab  # (B, 3)
        return self.head(self.embed(tokens).mean(dim=1))


def factored_blocks(grads: BatchGrads) -> dict[str, GradRows]:
    """The factored blocks by their first parameter's name (a Linear layer's weight)."""
    starts, start = {}, 0
    for name, shape in grads.shapes.items():
        starts[start] = name
        start += shape.numel()
    blocks = zip(grads.columns, grads.blocks, strict=True)
    return {starts[columns.start]: block for columns, block in blocks if block.factored}


MODELS = {
    "lenet": LeNet,
    "mlp": lambda: MLP(hidden=(32,)),
    "logreg": LogReg,
    "transformer": TinyTransformer,
    "tokens": TokenModel,
}


def epoch_data(model_name: str, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * epoch + len(model_name))
    x = torch.randn(N, 3, 32, 32, generator=g, dtype=torch.float64)
    return x, torch.randint(0, 5, (N,), generator=g)


def run(name, model_name, factored, data=None, **kwargs):
    """Orders of EPOCHS epochs and each epoch's last state, fed by one path's gradients of the
    examples ``data(epoch)`` (default :func:`epoch_data`)."""
    torch.manual_seed(0)
    model = MODELS[model_name]().double()
    # the orderings are under test: the rows are checked by tests/per_sample, not on each call
    method = "factored" if factored else "hooks"
    psg = make_per_sample(model, F.cross_entropy, method, check_every=0)
    d = sum(p.numel() for p in model.parameters())
    # depth 4 with steps of 5: levels 0-2 read as a block, levels 3-4 gathered
    bal = make(name, N, d, batch_size=B, depth=4, dtype=torch.float64, c=0.5, **kwargs)
    batch = B if name == "recursive_pair" else 5  # 5: pairs straddle steps, a short last step
    orders, states = [], []
    for epoch in range(EPOCHS):
        x, y = epoch_data(model_name, epoch) if data is None else data(epoch)
        for start in range(0, N, batch):
            idx = bal.order[start : start + batch]
            _, grads = psg(x[idx], y[idx])
            assert grads.factored == factored
            bal.step(grads, idx)
        model.zero_grad()
        orders.append(bal.order.tolist())
        states.append(bal.state_dict())  # before set_epoch clears the accumulators
        bal.set_epoch(epoch + 1)
    return orders, states


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("model_name", list(MODELS))
@pytest.mark.parametrize("name", BALANCES)
def test_factored_orders_and_state_equal_materialized(name, model_name, kernel, normalize):
    kw = {"kernel": kernel, "normalize": normalize}
    want_orders, wants = run(name, model_name, False, **kw)
    got_orders, gots = run(name, model_name, True, **kw)
    assert got_orders == want_orders
    for got, want in zip(gots, wants, strict=True):
        for key in ("acc", "grad_sum", "stale_mean", "pending"):
            if key in want:
                scale = want[key].abs().max().clamp_min(1e-300)
                error = (got[key] - want[key]).abs().max() / scale
                assert error <= RTOL, f"{key}: relative error {error:.2e}"
    assert wants[-1]["acc"].abs().max() > 0  # the test compares real accumulators


@pytest.mark.parametrize("name", ["mean", "pair"])
def test_a_projection_sketches_the_factors_like_the_materialized_rows(name):
    want_orders, wants = run(name, "lenet", False, projection_dim=16)
    got_orders, gots = run(name, "lenet", True, projection_dim=16)
    assert got_orders == want_orders
    torch.testing.assert_close(gots[-1]["acc"], wants[-1]["acc"], rtol=RTOL, atol=0)


def test_the_factored_path_keeps_linear_layers_as_factors():
    torch.manual_seed(0)
    x = torch.randn(B, 3, 32, 32, dtype=torch.float64)
    y = torch.randint(0, 5, (B,))
    model = LeNet().double()
    _, grads = make_per_sample(model, F.cross_entropy, "factored")(x, y)
    assert list(factored_blocks(grads)) == ["fc1.weight", "fc2.weight", "fc3.weight"]
    _, dense = make_per_sample(model, F.cross_entropy, "hooks")(x, y)
    materialized = grads.as_dict()  # explicit: the same per-sample gradients
    assert list(materialized) == list(dense.as_dict())
    for name, tensor in dense.as_dict().items():
        torch.testing.assert_close(materialized[name], tensor, rtol=1e-12, atol=1e-14)
    for i in (0, B - 1):
        got, want = (torch.empty(grads.width, dtype=grads.like.dtype) for _ in range(2))
        grads.write_row(i, got)
        dense.write_row(i, want)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_sequence_gram_sums_over_step_pairs():
    g = torch.Generator().manual_seed(1)
    a = torch.randn(4, 3, 5, generator=g, dtype=torch.float64)  # (B, T, in)
    delta = torch.randn(4, 3, 2, generator=g, dtype=torch.float64)  # (B, T, out)
    factors = LinearFactors(a, delta)
    flat = factors.materialize().reshape(4, -1)  # (B, out * in)
    torch.testing.assert_close(factors.gram(), flat @ flat.T, rtol=1e-12, atol=0)
    acc = torch.randn(6, 10, generator=g, dtype=torch.float64)  # (K, out * in)
    torch.testing.assert_close(factors.dots(acc), flat @ acc.T, rtol=1e-12, atol=0)


@pytest.mark.parametrize("equal", ["pairs", "all"])
@pytest.mark.parametrize("model_name", ["tokens", "mlp"])
@pytest.mark.parametrize("name", BALANCES)
def test_normalized_equal_examples_stay_bounded_on_factors(name, model_name, equal):
    """Equal examples (same input and label: in pairs, or all), ``normalize=True``: a pair's
    difference and, from the second epoch, an example equal to its centering mean are zero up to
    rounding. From a Gram matrix their norm was rounding, and their rounding scaled by
    ``1 / tiny`` filled the accumulator (~1e291, or NaN)."""
    x, y = epoch_data(model_name, 0)
    if equal == "pairs":
        x[1::2], y[1::2] = x[0::2], y[0::2]  # (N, ...): examples 2k and 2k + 1 equal
    else:
        x[:], y[:] = x[0], y[0]
    options = {"normalize": True, "first_epoch": "identity"}  # equal pairs side by side
    for factored in (True, False):
        _, states = run(name, model_name, factored, lambda epoch: (x, y), **options)
        for state in states:
            acc = state["acc"]
            assert torch.isfinite(acc).all() and acc.abs().max() < 10 * EPOCHS * N


def test_the_factored_path_keeps_an_embedding_compact_where_it_pays():
    x, y = epoch_data("tokens", 0)
    model = TokenModel().double()
    _, grads = make_per_sample(model, F.cross_entropy, "factored")(x[:B], y[:B])
    assert type(factored_blocks(grads)["embed.weight"]).__name__ == "EmbeddingRows"
    assert compact_pays(3, 11) and not compact_pays(4, 15)  # T² <= V


def test_cost_model_materializes_long_sequences_of_narrow_layers():
    assert factor_pays(1, 400, 120)
    assert factor_pays(8, 512, 512)
    assert not factor_pays(64, 16, 16)
    assert not factor_pays(0, 400, 120) and not compact_pays(0, 11)  # an empty sequence


class SumPool(nn.Module):
    """A Linear over ``(B, T, 8)`` summed over ``T`` (``T = 0``: no step), then a head."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.head = nn.Linear(8, 8), nn.Linear(8, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.inner(x)).sum(1))


@pytest.mark.parametrize("name", BALANCES)
def test_a_layer_on_an_empty_sequence_gives_rows_every_consumer_reads(name):
    """A call whose sequence is empty (``T = 0``): the inner Linear's rows are zeros, materialized
    (its factors, of no step, made the mean ordering's reshape and the GSNR pass fail)."""
    torch.manual_seed(0)
    model = SumPool().double()
    x, y = torch.randn(B, 0, 8, dtype=torch.float64), torch.arange(B) % 5
    _, grads = make_per_sample(model, F.cross_entropy, "factored")(x, y)
    assert [type(b).__name__ for b in grads.blocks] == ["DenseRows", "LinearFactors"]
    assert grads.as_dict()["inner.weight"].abs().max() == 0
    d = grads.width
    for feed in (grads, grads.dense().matrix):
        bal = make(name, N, d, batch_size=B, dtype=torch.float64, normalize=name != "recursive")
        bal.step(feed, bal.order[:B])
    vr_sgd = VRSGD(model.parameters(), lr=0.1)
    vr_sgd.observe(grads)  # the GSNR pass reads every block


def test_transformer_factors_sequence_layers_and_materializes_narrow_ones():
    x = torch.randn(B, 3, 32, 32, dtype=torch.float64)
    model = TinyTransformer().double()
    _, grads = make_per_sample(model, F.cross_entropy, "factored")(x, torch.zeros(B).long())
    # T = 3: embed (8 -> 12) pays 9 * 20 > 96 and stays materialized; qkv (12 -> 36) factors
    blocks = factored_blocks(grads)
    assert list(blocks) == ["qkv.weight", "up.weight", "down.weight", "head.weight"]
    assert blocks["qkv.weight"].a.shape == (B, 3, 12)


@pytest.mark.parametrize("model_name", list(MODELS))
def test_float32_quantities_agree_to_rounding(model_name):
    """float32: dots, Gram matrix and signed sums of both representations agree to 1e-4
    relative (a few hundred roundings of ~6e-8 each); orders may differ at near-ties."""
    torch.manual_seed(0)
    model = MODELS[model_name]()
    x, y = epoch_data(model_name, 0)
    _, factored = make_per_sample(model, F.cross_entropy, "factored")(x[:B].float(), y[:B])
    dense = DenseRows(torch.cat(factored.parts(), dim=1))
    d = dense.matrix.shape[1]
    acc = torch.randn(3, d)
    coef = torch.randn(B, 3)
    got_acc, want_acc = acc.clone(), acc.clone()
    factored.accumulate(got_acc, coef)
    dense.accumulate(want_acc, coef)
    for got, want in [
        (factored.dots(acc), dense.dots(acc)),
        (factored.dots(acc[0]), dense.dots(acc[0])),
        (factored.gram(), dense.gram()),
        (got_acc, want_acc),
    ]:
        assert ((got - want).abs().max() / want.abs().max()) <= 1e-4


def as_factors(z: torch.Tensor) -> BatchGrads:
    """Rows ``z (B, 16)`` as sequence factors: ``g = sum_t e_t z[t]ᵀ`` (T = 4, out = in = 4)."""
    a = z.reshape(-1, 4, 4)  # (B, T, in): step t carries row t of the 4 x 4 gradient
    delta = torch.eye(4, dtype=z.dtype).expand(len(z), 4, 4)  # (B, T, out): e_t
    return BatchGrads([LinearFactors(a, delta)], {"w": torch.Size([4, 4])})


@pytest.mark.parametrize("name", BALANCES)
def test_herding_quality_on_the_factored_path(name):
    n, d, b = 512, 16, 16  # as test_balance_properties: well below random orders' discrepancy
    g = torch.Generator().manual_seed(1234)
    z = torch.randn(n, d, generator=g)
    random_orders = [torch.randperm(n, generator=g) for _ in range(200)]
    median = torch.tensor([discrepancy(z, o) for o in random_orders]).median().item()
    bal = make(name, n, d, batch_size=b, seed=0)
    for epoch in range(5):
        for start in range(0, n, b):
            bal.step(as_factors(z[bal.order[start : start + b]]))
        bal.set_epoch(epoch + 1)
    assert discrepancy(z, bal.order.tolist()) < (median / 3 if name == "mean" else median / 2)


def test_three_line_api_and_mean_gradient_on_the_factored_pipeline():
    """``loss, grads = psg(x, y); sampler.step(grads)`` unchanged; ``param.grad`` (the mean, from
    the same backward) equals the materialized path's."""
    x, y = epoch_data("lenet", 0)
    grads_of = {}
    for method in ("factored", "hooks"):
        torch.manual_seed(0)
        model = LeNet().double()  # the same weights for both
        psg = PerSamplePipeline(model, F.cross_entropy, method=method)
        sampler = GraBSampler(N, model.parameters(), balance="mean", dtype=torch.float64)
        _, grads = psg(x[:B], y[:B])
        sampler.step(grads)
        grads_of[method] = [p.grad.clone() for p in model.parameters()]
        assert psg.method == method and sampler.pos == B
    for got, want in zip(grads_of["factored"], grads_of["hooks"], strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-15)
