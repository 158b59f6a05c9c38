"""Models that make an example's output depend on the batch without any gradient crossing
examples, or that keep state outside buffers (issue 49, found by a second adversarial review):
the mixing check runs every example of a checked batch alone (up to ``ALONE``), on the
attributes the call found, takes a difference for randomness only where a generator was drawn
from, and nothing of the extra forwards stays. Each case over several batches of one ``psg``
against a float64 per-example loop."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from fuzz.reference import state
from torch import nn

from grab_exp.per_sample import UnsupportedModelError, make_per_sample

F64 = torch.float64
METHODS = ("auto", "hooks", "factored", "func", "loop")


class SwapInputs(nn.Module):
    """For ``B >= 6`` the inputs of examples 3 and 4 are swapped: no gradient crosses them."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if len(x) >= 6:
            x = x[[0, 1, 2, 4, 3, *range(5, len(x))]]
        return self.b(torch.tanh(self.a(x)))


class RunningMean(nn.Module):
    """A batch mean kept in a buffer and subtracted in the same forward (training mode)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)
        self.register_buffer("mean", torch.zeros(6, dtype=F64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x)
        if self.training:
            self.mean = 0.9 * self.mean + 0.1 * h.detach().mean(0)
        return self.b(torch.tanh(h - self.mean))


class StepCounter(nn.Module):
    """A schedule kept in a plain ``int`` that the forward advances in training mode."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)
        self.step = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            self.step += 1
        return self.b(torch.tanh(self.a(x)) * (1.0 + 0.1 * self.step))


def batch(size: int, g: torch.Generator):
    return torch.randn(size, 5, generator=g, dtype=F64), torch.randint(0, 3, (size,), generator=g)


def gradient(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    twin = copy.deepcopy(model)
    named = [(n, p) for n, p in twin.named_parameters() if p.requires_grad]
    grads = torch.autograd.grad(F.cross_entropy(twin(x), y), [p for _, p in named])
    return {n: g for (n, _), g in zip(named, grads, strict=True)}


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("build", [SwapInputs, RunningMean], ids=["swap_inputs", "running_mean"])
def test_mixing_without_a_gradient_across_examples_is_refused(method: str, build) -> None:
    torch.manual_seed(0)
    model, g = build().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, F.cross_entropy, method)
    with pytest.raises(UnsupportedModelError) as error:
        for size in (1, 2, 7):  # the swap shows from 6 examples on, the running mean from 2
            x, y = batch(size, g)
            model.zero_grad(set_to_none=True)
            psg(x, y)
    assert "\n" not in str(error.value)
    assert all(p.grad is None for p in model.parameters())


class BatchNormedBehindDropout(nn.Module):
    """Its raw images normalized by the batch's statistics per channel in training mode
    (``F.batch_norm``, no BatchNorm module; no gradient through the statistics), then a
    Dropout."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(48, 8), nn.Dropout(0.2), nn.Linear(8, 3)
        self.register_buffer("mean", torch.zeros(3))
        self.register_buffer("var", torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x (B, 3, 4, 4)
        h = F.batch_norm(x, self.mean, self.var, training=self.training).flatten(1)
        return self.b(self.drop(torch.tanh(self.a(h))))


class ScaledByBatch(torch.autograd.Function):
    """The identity, whose backward scales by ``B / 4`` (each example's gradient then depends on
    how many it was batched with)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor) -> torch.Tensor:
        return h.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad * (grad.shape[0] / 4.0)


class CoupledBehindDropout(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.drop, self.b = nn.Linear(5, 8), nn.Dropout(0.2), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(self.drop(ScaledByBatch.apply(torch.tanh(self.a(x)))))


@pytest.mark.parametrize("method", ["auto", "hooks", "factored"])
def test_a_backward_that_couples_the_examples_behind_a_dropout_is_refused(method: str) -> None:
    """Adversarial round 42: the check of the examples alone, the only one that sees a coupled
    backward, was skipped where the forward draws (masks the examples alone cannot draw again):
    rows 0.95-1.43 off each example's own with its masks at B = 8 and 12, silently. With the
    modules that draw in eval mode, the batch's gradient of its examples' losses, weighted per
    example, is compared with theirs alone: refused on the first call of 8."""
    torch.manual_seed(0)
    model, g = CoupledBehindDropout().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, F.cross_entropy, method)
    with pytest.raises(UnsupportedModelError, match="couples the examples") as error:
        psg(*batch(8, g))
    assert "\n" not in str(error.value) and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("method", ["auto", "hooks", "factored"])
def test_mixing_in_training_mode_only_behind_a_dropout_is_refused(method: str) -> None:
    """Adversarial round 42: the mixing check ran the whole model again in eval mode, where the
    batch's statistics are the running ones and the examples mix no more, and took the
    difference for the Dropout's randomness: rows 0.21-0.30 off each example's own with its
    masks, on every call, silently. The modules that draw go to eval mode first, alone."""
    torch.manual_seed(0)
    model, g = BatchNormedBehindDropout().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.randn(4, 3, 4, 4, generator=g, dtype=F64), torch.tensor([0, 1, 2, 1])
    with pytest.raises(UnsupportedModelError, match="mixes the examples") as error:
        psg(x, y)
    assert "\n" not in str(error.value) and all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_mixing_is_refused_where_every_output_is_alike(method: str) -> None:
    """The inputs of examples 3 and 4 swapped under a head at zero (every output 0, as a head
    initialized at zero gives): running an example alone gives its output in the batch, so the
    mixing check sees nothing, and the identity holds on the batch's own graph; one example's
    row against its loss alone caught it only in a check whose turn fell on 3 or 4 (fuzzer,
    seed 68: rows 1.4 off). The rows of every example run alone are compared now."""
    torch.manual_seed(0)
    model, g = SwapInputs().double(), torch.Generator().manual_seed(1)
    for p in model.b.parameters():
        nn.init.zeros_(p)
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = batch(7, g)
    with pytest.raises(UnsupportedModelError, match="computed alone") as error:
        psg(x, y)
    assert "\n" not in str(error.value)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("method", METHODS)
def test_a_counter_kept_in_an_attribute_advances_once_a_call(method: str) -> None:
    torch.manual_seed(0)
    model, g = StepCounter().double(), torch.Generator().manual_seed(1)
    twin = copy.deepcopy(model)  # the plain step's model, alongside
    psg = make_per_sample(model, F.cross_entropy, method)
    for k, size in enumerate((4, 4, 6, 1), start=1):
        x, y = batch(size, g)
        alone = [gradient(model, x[i : i + 1], y[i : i + 1]) for i in range(size)]
        want = gradient(twin, x, y)
        F.cross_entropy(twin(x), y)  # the plain step's forward: its counter advances once
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        assert model.step == twin.step == k
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, torch.stack([a[n] for a in alone]), msg=n)
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, want[n], msg=f"call {k}: p.grad of {n}")


def test_auto_takes_a_model_with_a_lazy_layer() -> None:
    model = nn.Sequential(nn.LazyLinear(4), nn.Tanh(), nn.Linear(4, 3)).double()
    psg = make_per_sample(model, F.cross_entropy, "auto")
    x, y = batch(5, torch.Generator().manual_seed(1))
    _, grads = psg(x, y)
    assert grads.as_dict()["0.weight"].shape == (5, 4, 5)


class RareMixing(nn.Module):
    """Adds the batch's input mean to the examples whose first feature exceeds 1.3 (rare)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.where(x[:, :1] > 1.3, x + x.mean(0), x)
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("method", ["hooks", "factored"])
def test_after_a_refusal_every_kind_of_batch_is_checked_again(method: str) -> None:
    torch.manual_seed(0)
    model = RareMixing().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    g = torch.Generator().manual_seed(1)

    def calm(size: int):  # no example above the threshold
        x, y = batch(size, g)
        return x.clamp(max=1.0), y

    for x, y in (calm(12), calm(7), calm(7)):
        psg(x, y)  # right: nothing mixes (calls 1 and 2 are checked, call 3 is not)
    x, y = calm(7)
    x[2, 0] = 2.0
    with pytest.raises(UnsupportedModelError, match="mixes the examples"):
        psg(x, y)  # call 4: checked on the schedule
    x, y = calm(12)  # call 5, of a kind of batch that passed its check before the refusal
    x[5, 0] = 2.0
    with pytest.raises(UnsupportedModelError, match="mixes the examples"):
        psg(x, y)


class MomentumEncoder(nn.Module):
    """A frozen copy of ``a`` moved halfway to it by every training forward (MoCo's key encoder,
    mean teacher's EMA), its output part of the model's."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)
        self.k = copy.deepcopy(self.a).requires_grad_(False)
        with torch.no_grad():
            self.k.weight.add_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training:
            with torch.no_grad():
                for k, a in zip(self.k.parameters(), self.a.parameters(), strict=True):
                    k.mul_(0.5).add_(0.5 * a)
        return self.b(torch.tanh(self.a(x)) + 0.5 * torch.tanh(self.k(x)))


class ReadThenUpdate(nn.Module):
    """A buffer subtracted, then moved in place toward the batch mean: within a call every
    example sees the value the call found (no example sees another)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)
        self.register_buffer("mean", torch.full((6,), 0.3, dtype=F64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.a(x) - self.mean
        if self.training:
            self.mean.mul_(0.9).add_(0.1 * h.detach().mean(0))
        return self.b(torch.tanh(h))


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize(
    "build", [MomentumEncoder, ReadThenUpdate], ids=["momentum_encoder", "read_then_update"]
)
def test_a_forward_that_changes_frozen_weights_or_buffers_runs_once_a_call(method, build) -> None:
    """Every example on the weights and buffers the call found, and after the call the state of
    one plain step (the probes', checks', func's and loop's forwards leave nothing); func, which
    cannot carry the change out, refuses naming the tensor."""
    torch.manual_seed(0)
    model, g = build().double(), torch.Generator().manual_seed(1)
    twin = copy.deepcopy(model)  # the plain step's model, alongside
    psg = make_per_sample(model, F.cross_entropy, method)
    for k, size in enumerate((4, 4, 6, 1, 5), start=1):
        x, y = batch(size, g)
        alone = [gradient(model, x[i : i + 1], y[i : i + 1]) for i in range(size)]
        want = gradient(twin, x, y)
        F.cross_entropy(twin(x), y)  # the plain step's forward: the state moves once
        model.zero_grad(set_to_none=True)
        if method == "func":
            with pytest.raises(UnsupportedModelError, match=r"^(parameter k\.|buffer mean)"):
                psg(x, y)
            return
        _, grads = psg(x, y)
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, torch.stack([a[n] for a in alone]), msg=n)
        for n, grad in want.items():
            torch.testing.assert_close(
                model.get_parameter(n).grad, grad, msg=f"call {k}: p.grad of {n}"
            )
        for n, t in state(twin).items():  # buffers and frozen parameters
            torch.testing.assert_close(state(model)[n], t, msg=f"call {k}: {n}")
    assert method != "auto" or psg.method in ("hooks", "factored")  # no need to leave it


class SetOnce(nn.Module):
    """A buffer registered as ``None`` and set by the first forward (a lazily made constant)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(5, 3)
        self.register_buffer("scale", None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.scale is None:
            self.scale = torch.full((3,), 2.0, dtype=x.dtype)
        return self.a(x) * self.scale


@pytest.mark.parametrize("method", METHODS)
def test_a_buffer_set_by_the_first_forward(method: str) -> None:
    """``func`` refused it as a forward that "changes it in place" (round 34's Left): it now says
    that the forward sets it and how to go on (one plain forward first, after which func is
    right); the other methods leave it set, as a plain step does, with the rows right."""
    torch.manual_seed(0)
    model, g = SetOnce().double(), torch.Generator().manual_seed(2)
    x, y = batch(4, g)
    psg = make_per_sample(model, F.cross_entropy, method)
    if method == "func":
        with pytest.raises(UnsupportedModelError, match=r"^buffer scale: the model's forward sets"):
            psg(x, y)
        model(x)  # the plain forward the refusal asks for
    twin = copy.deepcopy(model)  # the reference's, its buffer set by its own first forward
    _, grads = psg(x, y)
    alone = [gradient(twin, x[i : i + 1], y[i : i + 1]) for i in range(len(y))]
    for n, rows in grads.as_dict().items():
        torch.testing.assert_close(rows, torch.stack([a[n] for a in alone]), msg=n)
    assert torch.equal(model.scale, torch.full((3,), 2.0, dtype=torch.float64))


class TrainableDecay(nn.Module):
    """Shrinks a trainable weight in place inside the forward (no example can see the weight
    the call found once another's forward ran)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            self.b.weight.mul_(0.9)
        return self.b(torch.tanh(self.a(x)))


@pytest.mark.parametrize("method", METHODS)
def test_a_forward_that_changes_a_trainable_weight_is_refused_naming_it(method: str) -> None:
    model = TrainableDecay().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = batch(4, torch.Generator().manual_seed(1))
    with pytest.raises(UnsupportedModelError, match=r"b\.weight: the model's forward changed"):
        psg(x, y)
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("method", METHODS)
def test_an_embedding_bag_with_max_norm_is_refused_naming_its_weight(method: str) -> None:
    """``EmbeddingBag(max_norm=...)`` renorms its weight in place in the forward; unlike
    ``Embedding``'s, that renorm is refused as any such change (docs/which-models-work.md)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.EmbeddingBag(10, 4, max_norm=0.5), nn.Linear(4, 3)).double()
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.randint(0, 10, (4, 3)), torch.tensor([0, 1, 2, 0])
    with pytest.raises(UnsupportedModelError, match=r"0\.weight"):
        psg(x, y)
    assert all(p.grad is None for p in model.parameters())
