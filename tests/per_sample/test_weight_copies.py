"""A narrow ``Conv2d`` on the CPU is recorded as one convolution grouped by example over its
weight copied per example (``Conv2dRule.copy_weight``): the one ``loss.backward()`` then gives the
weight's rows and, through the copy, ``weight.grad``. Against a per-example loop over several
batches; the layer's own forward is back after every call."""

from __future__ import annotations

import copy
import types

import pytest
import torch
import torch.nn.functional as F
from fuzz.models import FlatTanh
from torch import nn
from torch.utils.checkpoint import checkpoint

import grab_exp.per_sample.rules.conv2d as conv2d
from grab_exp.per_sample import UserCodeError, make_per_sample


class Narrow(nn.Module):
    """Two narrow convolutions (3 and 4 input channels) and a head; ``how`` varies the calls."""

    def __init__(self, how: str) -> None:
        super().__init__()
        bias = how != "no_bias"
        self.a = nn.Conv2d(3, 4, 3, stride=2 if how == "strided" else 1, bias=bias)
        self.b = nn.Conv2d(4, 4, 3, padding="same", dilation=2 if how == "dilated" else 1)
        self.head = nn.Linear(4, 5)
        self.how = how
        if how == "instance_norm":
            self.norm = nn.InstanceNorm2d(4, affine=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, 5)
        h = checkpoint(self.a, x, use_reentrant=False) if self.how == "checkpoint" else self.a(x)
        if self.how == "instance_norm":  # straight into b: its backward reads b's input gradient
            h = self.norm(h)
        else:
            h = FlatTanh.apply(h) if self.how == "view_grad" else torch.tanh(h)
        h = self.b(self.b(h)) if self.how == "twice" else self.b(h)
        if self.how == "no_grad_call":
            with torch.no_grad():
                extra = self.b(h)
            h = h + 0.1 * extra
        return self.head(h.mean((2, 3)))


HOWS = ["plain", "strided", "dilated", "no_bias", "twice", "checkpoint", "no_grad_call", "frozen"]
#: the layers before b that read its input gradient (round 36: a channels-last one from the
#: copies' grouped convolution made CPU instance_norm's backward 2.2 off, grad.view(-1) fail)
HOWS += ["instance_norm", "view_grad"]


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
    right_over_batches(how, method)


@pytest.mark.parametrize("how", ["instance_norm", "view_grad"])
def test_the_layers_before_get_a_plain_input_gradient_with_the_check_off(how: str) -> None:
    """With the check off nothing else would see it: the rows and param.grad were 2.2 and 2.5 off
    (instance_norm), silently."""
    right_over_batches(how, "hooks", check_every=0)


def right_over_batches(how: str, method: str, check_every: int = 128) -> None:
    torch.manual_seed(0)
    model = Narrow(how).double()
    if how == "frozen":
        model.a.weight.requires_grad_(False)
    plain = copy.deepcopy(model)
    psg = make_per_sample(model, F.cross_entropy, method, check_every=check_every)
    if method != "auto":  # the copies' path, not one that a refusal left for func
        assert psg.method == method
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
    right_over_batches("plain", "hooks")


def test_the_layers_forward_is_back_after_a_call_that_raises() -> None:
    torch.manual_seed(0)
    model = Narrow("plain")
    psg = make_per_sample(model, F.cross_entropy, "hooks")
    x, y = torch.randn(3, 3, 9, 9), torch.tensor([0, 1, 9])  # target 9 of 5 classes
    with pytest.raises(UserCodeError):  # a plain step raises it too: the loss's error
        psg(x, y)
    assert not any("_conv_forward" in vars(m) for m in model.modules())


class ScaledConv(nn.Conv2d):
    """A narrow convolution of its weight scaled: ``_conv_forward`` its own."""

    def _conv_forward(self, x, weight, bias):
        return super()._conv_forward(x, 1.5 * weight, bias)


class SelfPaddedConv(nn.Conv2d):
    """Pads its input itself (reflected) and convolves it unpadded, as timm's ``Conv2dSame``."""

    def _conv_forward(self, x, weight, bias):
        return super()._conv_forward(F.pad(x, (1, 1, 1, 1), mode="reflect"), weight, bias)


def _shifted(self: nn.Conv2d, x, weight, bias):
    return nn.Conv2d._conv_forward(self, 1.7 * x + 0.3, weight, bias)


def _instance_patched() -> nn.Conv2d:
    """A plain ``nn.Conv2d`` whose ``_conv_forward`` is set on the instance (a deepcopy binds it
    to the copy)."""
    conv = nn.Conv2d(3, 4, 3, padding=1)
    conv._conv_forward = types.MethodType(_shifted, conv)
    return conv


class Head(nn.Module):
    """A narrow convolution (3 input channels), then a head."""

    def __init__(self, conv: nn.Conv2d) -> None:
        super().__init__()
        self.conv, self.head = conv, nn.Linear(4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, 5)
        return self.head(torch.tanh(self.conv(x)).mean((2, 3)))


def _right_over_batches(model: nn.Module, method: str, change=None) -> None:
    """The loss, the rows and ``p.grad`` of every call against a plain step and a per-example
    loop on a copy; ``change(model)`` before call 3, which the schedule does not check."""
    plain = copy.deepcopy(model)
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    for call, batch in enumerate((1, 4, 1, 4, 1)):
        if call == 2 and change is not None:
            change(model)
            change(plain)
        x = torch.randn(batch, 3, 7, 7, generator=generator, dtype=torch.float64)
        y = torch.randint(0, 5, (batch,), generator=generator)
        model.zero_grad(set_to_none=True)
        plain.zero_grad(set_to_none=True)
        loss, grads = psg(x, y)
        want = F.cross_entropy(plain(x), y)
        want.backward()
        torch.testing.assert_close(loss, want.detach(), rtol=1e-12, atol=0)
        rows = reference(plain, x, y)
        for name, got in grads.as_dict().items():
            torch.testing.assert_close(got, rows[name], rtol=1e-9, atol=1e-12, msg=name)
        for p, q in zip(model.parameters(), plain.parameters(), strict=True):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize(
    "make", [lambda: ScaledConv(3, 4, 3), lambda: SelfPaddedConv(3, 4, 3), _instance_patched]
)
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_convolution_of_its_own_is_not_replaced_by_the_copies(make, method: str) -> None:
    """A narrow Conv2d whose ``_conv_forward`` is not ``nn.Conv2d``'s (a subclass's, one set on
    the instance) was run as the weight copies' grouped convolution instead: loss, rows and
    ``p.grad`` of another model, which the rows' mean could not see (wrong on batches of one).
    Right now, over batches of 1 and 4; the instance's own ``_conv_forward`` stays."""
    torch.manual_seed(0)
    model = Head(make()).double()
    own = vars(model.conv).get("_conv_forward")
    _right_over_batches(model, method)
    assert vars(model.conv).get("_conv_forward") is own


def _patch_class(model: nn.Module) -> None:
    type(model.conv)._conv_forward = _shifted


@pytest.mark.parametrize(
    "change", [lambda m: setattr(m.conv, "padding_mode", "reflect"), _patch_class]
)
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_convolution_changed_after_construction_is_followed(change, method: str) -> None:
    """A narrow Conv2d given ``padding_mode='reflect'``, or whose class's ``_conv_forward`` is
    patched, between calls: the call after (3, not a checked one) was still the zero-padded
    grouped convolution (loss, rows and ``p.grad`` wrong); now the layer leaves its rule."""
    local = type("LocalConv", (nn.Conv2d,), {})  # patched in this test only
    torch.manual_seed(0)
    _right_over_batches(Head(local(3, 4, 3, padding=1)).double(), method, change)
