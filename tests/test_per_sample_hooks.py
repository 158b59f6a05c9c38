"""The hook-based per-sample gradients equal a per-example loop (float64)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn import functional as F

from grab_exp.models import MLP, LeNet, LogReg
from grab_exp.per_sample_hooks import HookedPerSampleGradients, UnsupportedModelError
from grab_exp.runner.pipeline import FunctionalPipeline


def per_example_loop(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """Reference: one ordinary backward per example."""
    rows = {name: [] for name, _ in model.named_parameters()}
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for name, p in model.named_parameters():
            rows[name].append(p.grad.clone())
    return {name: torch.stack(g) for name, g in rows.items()}


class StridedConvNet(nn.Module):
    """Conv2d with stride, padding, dilation and no bias, plus a 3-d Linear input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, stride=2, padding=2, dilation=2, bias=False)
        self.head = nn.Linear(8, 10)

    def forward(self, x):
        h = torch.relu(self.conv(x))  # (B, 4, 16, 16)
        h = h.flatten(2)[..., :8]  # (B, 4, 8): a Linear over a sequence
        return self.head(h).mean(dim=1)


class AsymmetricConvNet(nn.Module):
    """Conv2d with a rectangular kernel and different stride/padding/dilation per axis."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 5, (3, 2), stride=(1, 3), padding=(0, 1), dilation=(2, 1))
        self.head = nn.LazyLinear(10)

    def forward(self, x):
        return self.head(torch.relu(self.conv(x[..., :29])).flatten(1))


def make_asymmetric() -> nn.Module:
    model = AsymmetricConvNet()
    model(torch.zeros(1, 3, 32, 32))  # materialize the lazy layer
    return model


@pytest.mark.parametrize("make_model", [LeNet, MLP, LogReg, StridedConvNet, make_asymmetric])
def test_hooks_equal_the_per_example_loop(make_model):
    torch.manual_seed(0)
    model = make_model().double()
    x = torch.randn(6, 3, 32, 32, dtype=torch.float64)
    y = torch.randint(0, 10, (6,))
    expected = per_example_loop(model, x, y)
    model.zero_grad(set_to_none=True)
    loss, grads = HookedPerSampleGradients(model, F.cross_entropy)(x, y)
    assert list(grads) == [n for n, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], expected[name], atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(p.grad, expected[name].mean(0), atol=1e-12, rtol=1e-10)
    assert loss.item() == pytest.approx(F.cross_entropy(model(x), y).item())


def test_unsupported_layer_is_named_and_auto_falls_back():
    model = nn.Sequential(nn.Flatten(), nn.Linear(3072, 8), nn.LayerNorm(8), nn.Linear(8, 10))
    with pytest.raises(UnsupportedModelError, match=r"^2 \(LayerNorm\)"):
        HookedPerSampleGradients(model, F.cross_entropy)
    assert FunctionalPipeline(model, F.cross_entropy, method="auto").method == "func"
    assert FunctionalPipeline(LeNet(), F.cross_entropy, method="auto").method == "hooks"


def test_batchnorm_in_training_mode_is_refused_by_name():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10))
    with pytest.raises(ValueError, match=r"1 \(BatchNorm2d\)"):
        HookedPerSampleGradients(model, F.cross_entropy)


def test_pipeline_method_is_validated():
    with pytest.raises(ValueError, match=r"^pipeline.method: got 'fast'; allowed: auto, func"):
        FunctionalPipeline(LeNet(), F.cross_entropy, method="fast")


def test_hook_and_func_pipelines_train_the_same():
    torch.manual_seed(1)
    x, y = torch.randn(16, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (16,))
    results = []
    for method in ("func", "hooks"):
        torch.manual_seed(2)
        model = LeNet().double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        pipeline = FunctionalPipeline(model, F.cross_entropy, method=method)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            pipeline(x, y)
            opt.step()
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1], atol=1e-10, rtol=1e-9)
