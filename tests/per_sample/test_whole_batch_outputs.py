"""Outputs and state that the batch's output alone cannot split by example (issue 49, found by
an adversarial reviewer): a leaf without a batch dimension (a VAE's ``kl.mean()``, a mixture of
experts' load-balancing term), a model that mixes two examples with each other (``x.flip(0)``
mixup), buffers a forward changes before ``auto`` leaves a path. Each is right or refused in one
line, over several batches of one ``psg``, against a float64 per-example loop."""

from __future__ import annotations

import copy
import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from support.plain_step import assert_a_plain_step_from_one_seed
from torch import nn

from grab_exp.per_sample import UnsupportedModelError, make_per_sample

F64 = torch.float64
SIZES = (1, 5, 8, 3)


class VAE(nn.Module):
    """``(reconstruction (B, 4), kl.mean() ())``: the KL is a mean of per-example terms."""

    def __init__(self) -> None:
        super().__init__()
        self.enc, self.dec = nn.Linear(4, 6), nn.Linear(3, 4)

    def forward(self, x: torch.Tensor, eps: torch.Tensor):
        mu, logvar = self.enc(x).chunk(2, dim=1)  # (B, 3) each
        z = mu + eps * (0.5 * logvar).exp()
        kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(1)  # (B,)
        return self.dec(z), kl.mean()


class SwitchMoE(nn.Module):
    """``(logits (B, 3), aux ())`` with a load-balancing term: a product of two batch means,
    not a mean of per-example terms."""

    def __init__(self) -> None:
        super().__init__()
        self.inp, self.gate, self.out = nn.Linear(4, 6), nn.Linear(6, 3), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor):
        h = torch.tanh(self.inp(x))
        p = self.gate(h).softmax(-1)  # (B, 3)
        f = F.one_hot(p.argmax(-1), 3).to(p.dtype).mean(0)
        return self.out(h * p.sum(-1, keepdim=True)), 3 * (f * p.mean(0)).sum()


class FlipMixup(nn.Module):
    """Mixes example ``i`` with example ``B - 1 - i``: two of them together look unmixed."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(0.7 * x + 0.3 * x.flip(0))


def vae_loss(out, target):
    return F.mse_loss(out[0], target) + out[1]


def switch_loss(out, y):
    return F.cross_entropy(out[0], y) + 0.5 * out[1]


def vae_batch(size: int, g: torch.Generator):
    x = (torch.randn(size, 4, generator=g, dtype=F64), torch.randn(size, 3, generator=g, dtype=F64))
    return x, torch.randn(size, 4, generator=g, dtype=F64)


def class_batch(size: int, g: torch.Generator):
    return torch.randn(size, 4, generator=g, dtype=F64), torch.randint(0, 3, (size,), generator=g)


def call(model, x):
    return model(*x) if isinstance(x, tuple) else model(x)


def example(x, i: int):
    return tuple(t[i : i + 1] for t in x) if isinstance(x, tuple) else x[i : i + 1]


def gradient(model: nn.Module, loss_fn, x, y) -> dict:
    """The gradient of ``loss_fn(model(x), y)`` on a copy of ``model`` (its buffers untouched)."""
    twin = copy.deepcopy(model)
    named = list(twin.named_parameters())
    loss = loss_fn(call(twin, x), y)
    grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    return {
        n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(named, grads, strict=True)
    }


def reference(model: nn.Module, loss_fn, x, y) -> tuple[dict, dict]:
    """Rows (each example's loss alone, on the model as it is) and the plain step's gradient."""
    alone = [gradient(model, loss_fn, example(x, i), y[i : i + 1]) for i in range(len(y))]
    rows = {n: torch.stack([a[n] for a in alone]) for n in alone[0]}
    return rows, gradient(model, loss_fn, x, y)


def assert_call_right(psg, model: nn.Module, loss_fn, x, y, label: str = "") -> None:
    """One call of ``psg``: its rows and ``param.grad`` are the float64 references'."""
    want_rows, want_grads = reference(model, loss_fn, x, y)
    model.zero_grad(set_to_none=True)
    _, grads = psg(x, y)
    for n, rows in grads.as_dict().items():
        torch.testing.assert_close(rows, want_rows[n], msg=f"{label}rows of {n}")
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, want_grads[n], msg=f"{label}p.grad of {n}")


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "func"])
def test_a_kl_mean_beside_the_output_is_right_on_every_method(method: str) -> None:
    torch.manual_seed(0)
    model, g = VAE().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, vae_loss, method)
    for size in SIZES:
        assert_call_right(psg, model, vae_loss, *vae_batch(size, g), f"B={size}: ")
        assert psg.method != "loop", psg.reason  # the fast paths get it right


class ScaledVAE(VAE):
    """:class:`VAE` with a parameter on its root (the KL's learned weight): the hook path
    replays the root, whose output has a leaf of the whole batch."""

    def __init__(self) -> None:
        super().__init__()
        self.beta = nn.Parameter(torch.tensor(0.5))

    def forward(self, x: torch.Tensor, eps: torch.Tensor):
        out, kl = super().forward(x, eps)
        return out, self.beta * kl


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "func", "loop"])
def test_a_kl_mean_beside_a_root_parameter_is_right_or_refused_naming_it(method: str) -> None:
    """Round 38: with a parameter on the root module, the hook path refused a VAE's ``kl.mean()``
    as a model that "mixes the examples"; it names the value of the whole batch that reaches the
    loss now. auto, func and loop are right."""
    torch.manual_seed(0)
    model, g = ScaledVAE().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, vae_loss, method)
    for size in SIZES:
        x, y = vae_batch(size, g)
        if method in ("hooks", "factored"):
            with pytest.raises(UnsupportedModelError, match=r"^<root> \(ScaledVAE\) returns a "
                               r"tensor of shape \(\) without a batch dimension \(a value of "
                               r"the whole batch"):  # fmt: skip
                psg(x, y)
            return
        assert_call_right(psg, model, vae_loss, x, y, f"B={size}: ")


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "func", "loop"])
@pytest.mark.parametrize(
    ("build", "loss_fn", "expected"),
    [
        (SwitchMoE, switch_loss, "value of the whole batch|not the mean|mean of the examples"),
        (FlipMixup, F.cross_entropy, "mixes the examples|differs from autograd"),
    ],
    ids=["load_balancing_term", "flip_mixup"],
)
def test_a_batch_that_is_not_its_examples_is_refused_at_its_first_call(
    method: str, build, loss_fn, expected: str
) -> None:
    torch.manual_seed(0)
    model, g = build().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, loss_fn, method)
    x, y = class_batch(3, g)
    with pytest.raises(UnsupportedModelError, match=f"{expected}|vmap failed") as error:
        psg(x, y)
    assert "\n" not in str(error.value)
    assert all(p.grad is None for p in model.parameters())


class CountedMoE(nn.Module):
    """A top-1 mixture whose second expert idles on a batch of one (the hook path leaves it on a
    later batch) and a step counter its forward advances."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.experts = nn.Linear(4, 2), nn.ModuleList(nn.Linear(4, 3) for _ in range(2))
        self.register_buffer("steps", torch.zeros((), dtype=F64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.steps += 1
        route = self.gate(x).argmax(-1)  # (B,)
        out = torch.zeros(len(x), 3, dtype=x.dtype)
        for e, expert in enumerate(self.experts):
            chosen = route == e
            if chosen.any():
                out = out.index_put((chosen.nonzero()[:, 0],), expert(x[chosen]))
        return out * (1 + 0.1 * self.steps)


def test_auto_puts_back_the_buffers_a_failed_path_changed() -> None:
    torch.manual_seed(0)
    model, g = CountedMoE().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, F.cross_entropy, "auto")
    with pytest.warns(UserWarning, match="method=loop"):
        for k, size in enumerate(SIZES, start=1):
            x, y = class_batch(size, g)
            want_rows, want_grads = reference(model, F.cross_entropy, x, y)
            model.zero_grad(set_to_none=True)
            _, grads = psg(x, y)
            assert model.steps.item() == k  # one forward's worth per call, as a plain step
            for n, rows in grads.as_dict().items():
                torch.testing.assert_close(rows, want_rows[n], msg=f"call {k}: rows of {n}")
            for n, p in model.named_parameters():
                got = torch.zeros_like(p) if p.grad is None else p.grad
                torch.testing.assert_close(got, want_grads[n], msg=f"call {k}: p.grad of {n}")


class Squeezed(nn.Module):
    """``head(h).squeeze()``: a batch of one loses its batch dimension ((3,), not (1, 3))."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.tanh(self.a(x))).squeeze()


def flat_loss(out, y):
    return F.cross_entropy(out.reshape(-1, 3), y)


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "func", "loop"])
def test_an_output_that_loses_a_batch_of_one_is_named_or_right(method: str) -> None:
    """At B=1 the fast paths name the missing batch dimension (at 11455ce func blamed the rows
    and hooks raised a reshape error); ``loop`` (the definition) is right, and ``auto`` takes it."""
    torch.manual_seed(0)
    model, g = Squeezed().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, flat_loss, method)
    for size in (4, 1, 3):
        x, y = class_batch(size, g)
        want_rows, want_grads = reference(model, flat_loss, x, y)
        model.zero_grad(set_to_none=True)
        if size == 1 and method in ("hooks", "factored", "func"):
            with pytest.raises(
                UnsupportedModelError, match=r"of shape \(3,\) for 1 example.*squeeze"
            ):
                psg(x, y)
            return
        _, grads = psg(x, y)
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want_rows[n], msg=f"B={size}: rows of {n}")
        for n, p in model.named_parameters():
            torch.testing.assert_close(p.grad, want_grads[n], msg=f"B={size}: p.grad of {n}")


class MoreOutputsForBigBatches(nn.Module):
    """Returns ``(logits,)`` for up to 3 examples and ``(logits, features)`` for more: the probe
    (2 and 3 copies of an example) sees one leaf, a batch of 5 two."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x: torch.Tensor):
        h = torch.tanh(self.a(x))
        return (self.b(h),) if len(x) <= 3 else (self.b(h), h)


def first_loss(out, y):
    return F.cross_entropy(out[0], y)


@pytest.mark.parametrize("method", ["hooks", "factored", "func"])
def test_an_output_whose_structure_differs_from_its_probe_is_refused_in_one_line(method) -> None:
    """Named, not a ``zip()`` error from inside the output check (b326fdb raised one)."""
    model = MoreOutputsForBigBatches().double()
    psg = make_per_sample(model, first_loss, method)
    x, y = class_batch(5, torch.Generator().manual_seed(1))
    with pytest.raises(UnsupportedModelError, match=r"output has 2 leaves for this batch and 1"):
        psg(x, y)
    assert all(p.grad is None for p in model.parameters())


class DroppedVAE(VAE):
    """The VAE with a dropout on its encoder's output (``p``; 0: none)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.drop = nn.Dropout(p)

    def forward(self, x: torch.Tensor, eps: torch.Tensor):
        mu, logvar = self.drop(self.enc(x)).chunk(2, dim=1)  # (B, 3) each
        z = mu + eps * (0.5 * logvar).exp()
        kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(1)  # (B,)
        return self.dec(z), kl.mean()


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "func"])
def test_a_kl_mean_is_right_over_steps_of_one_shape(method: str) -> None:
    """Between the checks' calls, func split the loss of its examples' outputs stacked as the
    batch's, where a value without a batch dimension was example 0's, not their mean: a VAE's
    kl.mean() was refused on the 3rd, 5th, 6th and 7th calls of one shape (as a training loop's
    steps) as a loss that is no mean."""
    torch.manual_seed(0)
    model, g = DroppedVAE(0.0).double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, vae_loss, method)
    for _ in range(7):
        assert_call_right(psg, model, vae_loss, *vae_batch(4, g))
    assert psg.method != "loop"


@pytest.mark.parametrize("method", ["auto", "hooks", "factored"])
def test_a_kl_mean_with_dropout_is_right_on_the_hook_path(method: str) -> None:
    """The resampled batches' forwards drew other masks than the batch's, so the check of an
    output without a batch dimension refused a VAE with dropout as a loss that is no mean. With
    random layers active it compares the losses' values, those layers in eval mode; the rows are
    the batch's own masks', ``p.grad`` a plain backward's under them."""
    torch.manual_seed(0)
    model, g = DroppedVAE(0.3).double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, vae_loss, method)
    for step, size in enumerate((4, 4, 1, 5, 4)):
        assert_a_plain_step_from_one_seed(psg, model, vae_loss, *vae_batch(size, g), step)
    assert psg.method in ("hooks", "factored") and model.drop.training


class DroppedSoftMoE(SwitchMoE):
    """A soft mixture with a dropout on its hidden features and an importance term over the batch
    (the gates' batch mean squared, as Shazeer et al.'s): no mean of per-example terms."""

    def __init__(self) -> None:
        super().__init__()
        self.drop = nn.Dropout(0.2)

    def forward(self, x: torch.Tensor):
        h = self.drop(torch.tanh(self.inp(x)))
        p = self.gate(h).softmax(-1)  # (B, 3)
        return self.out(h * p.sum(-1, keepdim=True)), 3 * (p.mean(0) ** 2).sum()


@pytest.mark.parametrize("method", ["auto", "hooks", "func"])
def test_a_term_of_the_whole_batch_with_dropout_is_refused_at_its_first_call(method: str) -> None:
    """With dropout active, func (auto's, and by name with randomness set) forms param.grad from
    its rows, and its full check skipped the resampled batches for want of the rows' graph: an
    importance term over the batch returned the examples' mean loss and its gradient, both
    wrong, on the checks' calls. The values of resampled batches' losses now refuse it, naming
    the cause, with param.grad as it was."""
    torch.manual_seed(0)
    model, g = DroppedSoftMoE().double(), torch.Generator().manual_seed(1)
    options = {"randomness": "different"} if method == "func" else {}
    psg = make_per_sample(model, switch_loss, method, **options)
    x, y = class_batch(5, g)
    with pytest.raises(UnsupportedModelError, match="not the mean of the examples' own losses"):
        psg(x, y)
    assert all(p.grad is None for p in model.parameters())


@dataclasses.dataclass
class Outputs:
    """An output class torch's pytree does not open."""

    logits: torch.Tensor
    features: torch.Tensor


class DataclassOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(4, 8), nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> Outputs:
        h = torch.tanh(self.a(x))
        return Outputs(self.b(h), h)


def dataclass_loss(out: Outputs, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(out.logits, y) + 0.1 * out.features.pow(2).sum(1).mean()


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "loop"])
def test_a_dataclass_output_is_checked_by_its_values(method: str) -> None:
    """Round 29: the checks split an output the pytree does not open as one leaf, so the loss ran
    on the whole batch's output with one example's target (cross-entropy's own batch-size error
    as the refusal; a broadcasting MSE made auto raise LossContractError for a mean). Such an
    output is checked as a value of the whole batch is, by forwards of the examples."""
    torch.manual_seed(0)
    model, g = DataclassOut().double(), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, dataclass_loss, method)
    for size in (*SIZES, 3, 5):
        assert_call_right(psg, model, dataclass_loss, *class_batch(size, g), f"B={size}: ")
    assert psg.method == ("factored" if method == "auto" else method)


class ListOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        return list(self.a(x).unbind(0))  # one tensor per example


def list_loss(out: list[torch.Tensor], y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(torch.stack(out), y)


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "func", "loop"])
def test_a_list_of_per_example_outputs_is_named_or_right(method: str) -> None:
    """Round 29: a raw ``zip()`` error on the hook path and func (the hook path advised func);
    now refused in one line naming the leaves' counts and loop; auto takes loop, right."""
    torch.manual_seed(0)
    model, g = ListOut().double(), torch.Generator().manual_seed(1)
    x, y = class_batch(5, g)
    if method in ("hooks", "factored", "func"):
        with pytest.raises(UnsupportedModelError, match="2 leaves for two examples and 3") as e:
            make_per_sample(model, list_loss, method)(x, y)
        assert "\n" not in str(e.value) and "zip()" not in str(e.value)
        return
    want_rows, _ = reference(model, list_loss, x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # auto announces loop
        _, grads = make_per_sample(model, list_loss, method)(x, y)
    for n, rows in grads.as_dict().items():
        torch.testing.assert_close(rows, want_rows[n])
