"""A model whose forward keeps the examples apart and whose backward couples them (adversarial
review 4): every forward of an example alone is its output in the batch, and the hook path's rows
add up to autograd's gradient and pass the weighted identity, yet an example's row is not the
gradient of its loss computed alone. A full check compares one example's row with that gradient
(a forward and backward of its own): refused at the first call, on every method, ``p.grad`` as it
was."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grab_exp.per_sample import UnsupportedModelError, make_per_sample


class ScaledByBatchSize(torch.autograd.Function):
    """The identity, whose backward multiplies by the batch size (a mean made a sum)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.batch = inputs[0].shape[0]

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * ctx.batch


class Coupled(nn.Module):
    """``function``: :class:`ScaledByBatchSize` after the first layer; ``detached``: ``h`` in the
    forward and ``k * grad`` in the backward, ``k`` from the whole batch's activations."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.a, self.b, self.how = nn.Linear(6, 8), nn.Linear(8, 3), how

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 6) -> (B, 3)
        h = torch.tanh(self.a(x))
        if self.how == "function":
            return self.b(ScaledByBatchSize.apply(h))
        k = 1.0 / (h.detach().pow(2).mean().sqrt() + 1e-3)  # a value of the whole batch
        return self.b(h * k + (h - h * k).detach())


@pytest.mark.parametrize("how", ["function", "detached"])
@pytest.mark.parametrize("method", ["hooks", "factored", "auto", "func", "loop"])
def test_a_backward_that_couples_the_examples_is_refused(how: str, method: str) -> None:
    torch.manual_seed(0)
    model = Coupled(how).double()
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    with pytest.raises(UnsupportedModelError) as error:
        psg(x, y)
    message = str(error.value)
    assert "\n" not in message
    if method in ("hooks", "factored"):
        assert "gradient of their losses computed alone" in message
    assert all(p.grad is None for p in model.parameters())


def loss_every_target_ignored(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Cross-entropy over targets that are all ``ignore_index`` (NaN: no target counts) plus a
    finite per-example term: the batch loss is not finite, the layers' gradients are."""
    return F.cross_entropy(out, y) + 0.1 * out.pow(2).sum(1).mean()


@pytest.mark.parametrize("method", ["hooks", "factored", "auto", "func", "loop"])
def test_a_coupled_backward_is_refused_under_a_loss_that_is_not_finite(method: str) -> None:
    """Fuzzer seed 2832: with no full check under a NaN batch loss, the rows it scaled by B were
    returned (the rows' mean is ``p.grad``, scaled alike); the example alone compares the
    gradients that are finite."""
    torch.manual_seed(0)
    model = Coupled("function").double()
    psg = make_per_sample(model, loss_every_target_ignored, method)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.full((4,), -100)
    with pytest.raises(UnsupportedModelError) as error:
        psg(x, y)
    assert "\n" not in str(error.value)
    assert all(p.grad is None for p in model.parameters())


class Once(torch.autograd.Function):
    """Twice its input, whose backward frees what the forward kept (a second backward fails)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.kept = x.detach()
        return x * 2

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        del ctx.kept
        return grad * 2


class Freeing(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(Once.apply(torch.tanh(self.a(x))))


@pytest.mark.parametrize("method", ["hooks", "auto"])
def test_a_function_whose_backward_runs_once_is_named_as_seen(method: str) -> None:
    """The hook path's check runs a second backward through the batch's graph, which such a
    function cannot: refused with AttributeError's line alone (no cause); now the refusal says
    what failed; ``auto`` goes on to ``loop`` (func's vmap refuses a Function without
    ``setup_context``), which is right."""
    torch.manual_seed(0)
    model = Freeing().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    if method == "hooks":
        with pytest.raises(UnsupportedModelError, match=r"^the check's second backward through"):
            psg(x, y)
        return
    with pytest.warns(UserWarning, match="second backward through the batch's graph raised"):
        _, grads = psg(x, y)
    for i in range(len(y)):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for n, p in model.named_parameters():
            torch.testing.assert_close(grads.as_dict()[n][i], p.grad, msg=n)
