"""GSNR's moments in one pass: factored Linear layers read as factors (never a per-example
matrix), dense blocks wider than the cache block, against the materialized gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from grab_exp.grads import DenseRows, LinearFactors
from grab_exp.models import LeNet
from grab_exp.optim import gsnr_ratios
from grab_exp.optim.moments import CACHE_VALUES, column_moments
from grab_exp.per_sample import make_per_sample

F64 = torch.float64
B = 8


class SequenceNet(nn.Module):
    """Linear layers on ``(B, T, in)`` sequences (T = 3): factored with ``T > 1``."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Linear(32, 48)
        self.head = nn.Linear(48, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.embed(x.reshape(x.shape[0], 3, -1)[..., :32]))  # (B, 3, 48)
        return self.head(h.mean(dim=1))  # (B, 5)


def per_sample(model_cls, method: str):
    torch.manual_seed(0)
    model = model_cls().double()
    g = torch.Generator().manual_seed(1)
    x = torch.randn(B, 3, 32, 32, generator=g, dtype=F64)
    y = torch.randint(0, 5, (B,), generator=g)
    return make_per_sample(model, F.cross_entropy, method)(x, y)[1]


class LargestOutput(TorchDispatchMode):
    """The largest tensor any operator writes (views included) while active."""

    def __init__(self) -> None:
        super().__init__()
        self.numel = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.numel = max(self.numel, t.numel())
        return out


@pytest.mark.parametrize("groups", [None, 4, 2])
@pytest.mark.parametrize("model_cls", [LeNet, SequenceNet])
def test_factored_gradients_give_the_materialized_ratios(model_cls, groups):
    factored = per_sample(model_cls, "factored")
    assert any(isinstance(block, LinearFactors) for block in factored.blocks)
    want = gsnr_ratios(per_sample(model_cls, "hooks").as_dict(), groups=groups)
    got = gsnr_ratios(factored, groups=groups)
    assert got.names == want.names
    # float64; the cancellation in σ² = mean square - ḡ² amplifies rounding by about 1 + r
    torch.testing.assert_close(got.flat, want.flat, rtol=1e-6, atol=1e-12)
    assert (int(got.clip_low), int(got.clip_high)) == (int(want.clip_low), int(want.clip_high))
    assert 0 < int(got.clip_low) < got.numel


def test_factored_lenet_is_never_materialized_per_example():
    grads = per_sample(LeNet, "factored")
    widest = max(block.width for block in grads.blocks)
    assert B * widest > max(grads.width, CACHE_VALUES)  # a per-example block would show
    with LargestOutput() as largest:
        gsnr_ratios(grads)
    assert largest.numel <= max(grads.width, CACHE_VALUES)


@pytest.mark.parametrize("k", [16, 4])
def test_a_dense_block_wider_than_the_cache_block(k):
    g = torch.Generator().manual_seed(2)
    width = 3 * CACHE_VALUES // 16 + 5  # three cache blocks and a narrow fourth
    x = torch.randn(16, width, generator=g, dtype=F64) + 0.5  # (B, w)
    groups = x.reshape(k, 16 // k, width).mean(dim=1)  # (k, w)
    rows = DenseRows(x)
    mean, second = column_moments([(slice(0, width), rows)], width, k, F64)
    torch.testing.assert_close(mean, groups.mean(dim=0), rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(second, (groups * groups).mean(dim=0), rtol=1e-12, atol=1e-15)
    float32 = column_moments([(slice(0, width), rows)], width, k, torch.float32)
    torch.testing.assert_close(float32[1], second.float(), rtol=1e-5, atol=1e-6)
