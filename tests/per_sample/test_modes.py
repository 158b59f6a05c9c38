"""A model whose layers run in one mode only (issue 49, found by an adversarial reviewer): the
hook path plans each kind of batch in each mode of its modules, so a layer idle in training mode
that runs in eval mode is planned when it runs, not refused as data-dependent control flow."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from grab_exp.per_sample import make_per_sample

F64 = torch.float64


class ModeNet(nn.Module):
    """Its BatchNorm (in eval mode: running statistics) runs only when the model is in eval."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.bn, self.o = nn.Linear(5, 8), nn.BatchNorm1d(8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        h = h * 0.5 + 1.0 if self.training else self.bn(h)
        return self.o(torch.relu(h))


def rows_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    named = list(model.named_parameters())
    rows: dict[str, list] = {n: [] for n, _ in named}
    for i in range(len(y)):
        twin = copy.deepcopy(model)
        params = list(twin.parameters())
        loss = F.cross_entropy(twin(x[i : i + 1]), y[i : i + 1])
        grads = torch.autograd.grad(loss, params, allow_unused=True)
        for (n, p), g in zip(named, grads, strict=True):
            rows[n].append(torch.zeros_like(p) if g is None else g)
    return {n: torch.stack(r) for n, r in rows.items()}


@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_layer_that_runs_in_eval_mode_only_is_planned_in_that_mode(method: str) -> None:
    torch.manual_seed(0)
    model = ModeNet().double()
    model.bn.eval()
    psg = make_per_sample(model, F.cross_entropy, method)
    g = torch.Generator().manual_seed(1)
    for k, size in enumerate((1, 5, 8, 3, 5)):
        model.train(k % 2 == 0)
        model.bn.eval()
        x, y = (
            torch.randn(size, 5, generator=g, dtype=F64),
            torch.randint(0, 3, (size,), generator=g),
        )
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        assert psg.method in ("hooks", "factored"), psg.method
        want = rows_of(model, x, y)
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want[n], msg=f"call {k}: rows of {n}")


def small_convnext(stochastic_depth: float) -> nn.Module:
    from torchvision.models.convnext import CNBlockConfig, ConvNeXt

    torch.manual_seed(0)
    blocks = [CNBlockConfig(8, 16, 2), CNBlockConfig(16, None, 1)]
    return ConvNeXt(blocks, stochastic_depth_prob=stochastic_depth, num_classes=5).double()


def test_torchvisions_stochastic_depth_is_a_random_module() -> None:
    """ConvNeXt's blocks (replayed: each owns its layer scale) drop their branch at random in
    training mode: every path names it (before, auto's refusal named batch statistics or class
    weights, and some calls passed): the hook path cannot replay the draws, torch.func's vmap
    cannot batch torchvision's in-place draw, and loop's examples would draw other masks."""
    x = torch.randn(3, 3, 32, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    y = torch.tensor([0, 3, 1])
    with pytest.raises(ValueError, match=r"draws random numbers in stochastic_depth"):
        make_per_sample(small_convnext(0.1).train(), F.cross_entropy, "hooks")(x, y)
    with pytest.raises(ValueError, match=r"method=loop: .*\(StochasticDepth\) draws random"):
        make_per_sample(small_convnext(0.1).train(), F.cross_entropy, "auto")(x, y)
    model = small_convnext(0.1).eval()  # no draws: the hook path takes it
    psg = make_per_sample(model, F.cross_entropy, "auto")
    for _ in range(3):
        psg(x, y)
    assert psg.method in ("hooks", "factored")
