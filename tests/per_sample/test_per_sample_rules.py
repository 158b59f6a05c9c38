"""Every per-layer rule and the per-layer torch.func fallback against a per-example loop."""

from __future__ import annotations

import pytest
import torch
from support.layer_harness import LayerCase, build, check_layer, make_input, per_example_loop
from torch import nn
from torch.nn import functional as F

from grab_exp.per_sample import (
    HookedPerSample,
    PerSamplePipeline,
    UnsupportedModelError,
    make_per_sample,
)
from grab_exp.per_sample.fallback import FuncFallback
from grab_exp.per_sample.rules import RULES, LayerRule, rule_for
from grab_exp.per_sample.rules.conv2d import grouped_weight_grads, unfold_weight_grads
from grab_exp.per_sample.rules.linear import LinearRule


class SeqHead(nn.Module):
    """``(B, T, D)`` features -> mean over T -> ``(B, 3)`` logits."""

    def __init__(self, body: nn.Module, width: int) -> None:
        super().__init__()
        self.body = body
        self.head = nn.Linear(width, 3)

    def forward(self, x):
        return self.head(self.body(x).mean(dim=1))


class Gain(nn.Module):
    """A custom layer with raw parameters of its own, and a Linear inside."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.gain = nn.Parameter(torch.linspace(0.5, 1.5, width))
        self.shift = nn.Parameter(torch.zeros(width))
        self.inner = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.inner(x) * self.gain + self.shift)


class RootScale(nn.Module):
    """The root module owns a parameter: its fallback re-runs the whole model."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.scale = nn.Parameter(torch.linspace(0.5, 1.5, 3))

    def forward(self, x):
        return self.fc(x) * self.scale


def _conv(conv: nn.Conv2d) -> nn.Module:
    return nn.Sequential(conv, nn.ReLU(), nn.Flatten(), nn.LazyLinear(3))


def _norm_2d() -> nn.Module:
    return nn.Sequential(nn.LayerNorm((4, 6)), nn.Flatten(2))  # (B, 3, 4, 6) -> (B, 3, 24)


def _eval_batchnorm() -> nn.Module:
    model = nn.Sequential(nn.Conv2d(2, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(3))
    with torch.no_grad():
        model[1].running_mean.uniform_(-1.0, 1.0)
        model[1].running_var.uniform_(0.5, 2.0)
        model[1].weight.uniform_(0.5, 1.5)
    return model.eval()


# Every registered rule: models containing that layer type (a new rule needs a case here).
RULE_CASES: dict[type[nn.Module], list[LayerCase]] = {
    nn.Linear: [
        LayerCase(lambda: nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3)), (6,)),
        LayerCase(lambda: SeqHead(nn.Linear(6, 5, bias=False), 5), (4, 6)),  # (B, T, in)
    ],
    nn.Conv2d: [
        LayerCase(lambda: _conv(nn.Conv2d(2, 3, 3, stride=2, padding=2, dilation=2)), (2, 9, 9)),
        LayerCase(lambda: _conv(nn.Conv2d(2, 3, (3, 2), stride=(1, 2), bias=False)), (2, 7, 8)),
        LayerCase(lambda: _conv(nn.Conv2d(2, 3, (3, 5), padding="same", dilation=2)), (2, 6, 7)),
        LayerCase(lambda: _conv(nn.Conv2d(2, 3, 3, padding="valid")), (2, 5, 5)),
        LayerCase(lambda: _conv(nn.Conv2d(8, 3, 3, stride=2)), (8, 7, 7)),  # default layout
        # wide (L <= O output positions): the unfold + bmm formulation
        LayerCase(lambda: _conv(nn.Conv2d(2, 12, 3, stride=2, padding=1)), (2, 5, 5)),
        LayerCase(lambda: _conv(nn.Conv2d(3, 16, 3, padding="same", dilation=2)), (3, 4, 4)),
        LayerCase(
            lambda: _conv(nn.Conv2d(2, 12, (3, 2), stride=(2, 1), padding=(1, 0))), (2, 5, 4)
        ),
    ],
    nn.Embedding: [
        LayerCase(lambda: SeqHead(nn.Embedding(10, 4), 4), (5,), integer_input=True),
        LayerCase(lambda: SeqHead(nn.Embedding(10, 4, padding_idx=3), 4), (5,), integer_input=True),
    ],
    nn.LayerNorm: [
        LayerCase(lambda: nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Linear(8, 3)), (6,)),
        LayerCase(lambda: SeqHead(nn.LayerNorm(6, bias=False), 6), (4, 6)),  # summed over T
        LayerCase(lambda: SeqHead(_norm_2d(), 24), (3, 4, 6)),  # normalized_shape (4, 6)
    ],
}

# Trainable layers without a rule: the per-layer torch.func fallback, named in ``fallback``.
FALLBACK_CASES = {
    "groupnorm": LayerCase(
        lambda: nn.Sequential(nn.Linear(6, 8), nn.GroupNorm(2, 8), nn.Linear(8, 3)), (6,), {"1"}
    ),
    "custom": LayerCase(
        lambda: nn.Sequential(nn.Linear(6, 5), Gain(5), nn.Linear(5, 3)), (6,), {"1"}
    ),
    "grouped_conv": LayerCase(lambda: _conv(nn.Conv2d(2, 4, 3, groups=2)), (2, 6, 6), {"0"}),
    "reflect_conv": LayerCase(
        lambda: _conv(nn.Conv2d(2, 3, 3, padding=1, padding_mode="reflect")), (2, 5, 5), {"0"}
    ),
    "asymmetric_same_conv": LayerCase(
        lambda: _conv(nn.Conv2d(2, 3, 2, padding="same")), (2, 5, 5), {"0"}
    ),
    "batchnorm_eval": LayerCase(_eval_batchnorm, (2, 5, 5), {"1"}),
    "root_parameter": LayerCase(RootScale, (6,), {""}),
}


@pytest.mark.parametrize(
    ("conv", "size"),
    [(nn.Conv2d(3, 4, 3, stride=2, padding=1, dilation=2), 9), (nn.Conv2d(5, 6, (1, 3)), 4)],
)
def test_both_conv_formulations_equal_the_per_example_weight_gradient(conv, size):
    generator = torch.Generator().manual_seed(0)
    conv = conv.double()
    a = torch.randn(4, conv.in_channels, size, size, generator=generator, dtype=torch.float64)
    g = torch.randn(conv(a).shape, generator=generator, dtype=torch.float64)
    reference = torch.stack(
        [
            torch.nn.grad.conv2d_weight(
                a[i : i + 1],
                conv.weight.shape,
                g[i : i + 1],
                stride=conv.stride,
                padding=conv.padding,
                dilation=conv.dilation,
            )
            for i in range(4)
        ]
    )  # (B, O, C, kh, kw)
    buffer = torch.zeros(4, reference[0].numel() + 3, dtype=torch.float64)
    out = buffer[:, 3:].view(reference.shape)  # a column block of a (B, d) buffer, as hooks use
    torch.testing.assert_close(grouped_weight_grads(conv, a, g), reference, rtol=1e-12, atol=0)
    torch.testing.assert_close(unfold_weight_grads(conv, a, g), reference, rtol=1e-12, atol=0)
    assert unfold_weight_grads(conv, a, g, out).data_ptr() == out.data_ptr()
    torch.testing.assert_close(out, reference, rtol=1e-12, atol=0)


def test_every_registered_rule_has_cases():
    assert set(RULE_CASES) == set(RULES)
    assert all(isinstance(rule, LayerRule) for rule in RULES.values())


@pytest.mark.parametrize(
    ("layer_type", "index"),
    [(t, i) for t in sorted(RULES, key=lambda t: t.__name__) for i in range(len(RULE_CASES[t]))],
    ids=lambda v: v.__name__ if isinstance(v, type) else str(v),
)
def test_rule_equals_the_per_example_loop(layer_type, index):
    hooked = check_layer(RULE_CASES[layer_type][index])
    assert any(isinstance(layer, layer_type) for layer in hooked.registry.modules.values())


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel")  # torch's own note
@pytest.mark.parametrize("name", list(FALLBACK_CASES))
def test_fallback_equals_the_per_example_loop(name):
    check_layer(FALLBACK_CASES[name])


def test_the_fallback_is_per_layer():
    case = FALLBACK_CASES["groupnorm"]
    hooked = check_layer(case)
    assert set(hooked.registry.rules) == {"0", "2"} and set(hooked.registry.fallbacks) == {"1"}
    assert all(isinstance(rule, LinearRule) for rule in hooked.registry.rules.values())
    assert isinstance(hooked.registry.fallbacks["1"], FuncFallback)
    calls = []
    fallback = hooked.registry.fallbacks["1"]
    run = fallback.per_sample

    def spy(*args):
        grads = run(*args)
        calls.append(len(grads))
        return grads

    fallback.per_sample = spy
    hooked(*make_input(case, 4, seed=3))
    assert calls == [2]  # once per call, for the GroupNorm's weight and bias only


def test_a_custom_layers_inner_linear_keeps_its_rule():
    hooked = check_layer(FALLBACK_CASES["custom"])
    assert set(hooked.registry.fallbacks) == {"1"} and isinstance(
        hooked.registry.rules["1.inner"], LinearRule
    )
    assert hooked.registry.fallbacks["1"].names == ["gain", "shift"]


def test_frozen_parameters_of_a_fallback_layer_are_skipped():
    case = FALLBACK_CASES["groupnorm"]
    model = build(case)
    model[1].weight.requires_grad_(False)
    x, y = make_input(case, 4, seed=4)
    _, grads = HookedPerSample(model, F.cross_entropy, reuse_buffer=True)(x, y)
    grads = grads.as_dict()
    assert "1.weight" not in grads and grads["1.bias"].shape == (4, 8)
    assert model[1].weight.grad is None and model[1].bias.grad is not None


@pytest.mark.parametrize("method", ["auto", "hooks", "func"])
def test_an_embedding_scaled_by_the_batchs_token_counts_is_refused(method):
    model = SeqHead(nn.Embedding(10, 4, scale_grad_by_freq=True), 4)
    with pytest.raises(ValueError, match=r"^body \(Embedding\) with scale_grad_by_freq=True"):
        make_per_sample(model, F.cross_entropy, method)


def test_rule_for_follows_subclasses_and_refuses_unsupported_configs():
    assert isinstance(rule_for(nn.LazyLinear(3)), LinearRule)
    assert rule_for(nn.Conv2d(2, 4, 3, groups=2)) is None
    assert rule_for(nn.GroupNorm(2, 4)) is None
    assert rule_for(nn.Embedding(5, 2, max_norm=1.0)) is None
    assert rule_for(nn.Embedding(5, 2, sparse=True)) is rule_for(nn.Embedding(5, 2))  # dense rows


def test_auto_picks_hooks_with_fallback_layers_but_not_for_a_root_parameter():
    for name in ("groupnorm", "custom", "batchnorm_eval"):
        pipeline = PerSamplePipeline(build(FALLBACK_CASES[name]), F.cross_entropy)
        assert pipeline.method in ("hooks", "factored"), name
    assert PerSamplePipeline(RootScale(), F.cross_entropy).method == "func"


class TupleOut(nn.Module):
    """A linear layer, then a custom layer that returns a tuple."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.pair = Pair()

    def forward(self, x):
        return self.pair(self.fc(x))[0]


class Pair(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, h):
        return h * self.scale, h


class DirectUse(nn.Module):
    """Uses ``fc``'s parameters without calling ``fc``."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)

    def forward(self, x):
        return F.linear(x, self.fc.weight, self.fc.bias)


class BatchCentered(nn.Module):
    """A layer that subtracts the batch mean: it mixes the examples."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 3)
        self.gain = nn.Parameter(torch.ones(3))

    def forward(self, x):
        h = self.fc(x) * self.gain
        return h - h.mean(dim=0)


@pytest.mark.parametrize("model", [TupleOut, DirectUse])
def test_tuples_and_parameters_used_by_a_parent_are_right(model):
    model = model().double()
    x, y = make_input(FALLBACK_CASES["groupnorm"], 3, seed=5)
    x = x.reshape(3, -1)[:, :6]
    expected = per_example_loop(model, x, y)
    _, grads = HookedPerSample(model, F.cross_entropy)(x, y)
    for name, want in expected.items():
        torch.testing.assert_close(grads.as_dict()[name], want, atol=1e-12, rtol=1e-10)


def test_a_layer_that_mixes_the_examples_is_refused_by_name():
    model = BatchCentered().double()
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    # each example alone is centered to zero: every per-example gradient of fc is zero
    with pytest.raises(UnsupportedModelError, match=r"^the model mixes the examples of a batch"):
        HookedPerSample(model, F.cross_entropy)(x, y)


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_an_embeddings_weighted_sum_from_its_tokens_equals_its_rows(padding_idx):
    """The rows' mean check reads an embedding's ``B*T*D`` token gradients
    (``EmbeddingRule.weighted_sum``) instead of its ``B*V*D`` rows: the same ``sum_i c_i g_i``,
    indices of any shape, ``padding_idx`` included."""
    generator = torch.Generator().manual_seed(0)
    layer = nn.Embedding(7, 3, padding_idx=padding_idx).double()
    a = torch.randint(0, 7, (4, 5, 2), generator=generator)  # (B, *)
    g = torch.randn(4, 5, 2, 3, generator=generator, dtype=torch.float64)  # (B, *, D)
    c = torch.randn(4, generator=generator, dtype=torch.float64)
    rule = RULES[nn.Embedding]
    rows = rule.per_sample(layer, a, g)[0]  # (B, V, D)
    acc = torch.randn(7, 3, generator=generator, dtype=torch.float64)
    want = acc + torch.tensordot(c, rows, dims=1)
    rule.weighted_sum(layer, a, g, c, acc)
    torch.testing.assert_close(acc, want, rtol=1e-12, atol=1e-12)
