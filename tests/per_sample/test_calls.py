"""How a user calls ``psg(x, y)``: inputs as a list, a model with nothing left to train
(adversarial review 11: a list was spread into positional arguments, which the plain step does
not do; a model with every parameter frozen was refused with an IndexError or "grads is an empty
dict")."""

from __future__ import annotations

import pytest
import torch
from fuzz.reference import reference
from torch import nn
from torch.nn import functional as F

from grab_exp.per_sample import UnsupportedModelError, UserCodeError, make_per_sample

METHODS = ["auto", "hooks", "factored", "func", "loop"]


class TwoInputs(nn.Module):
    """``forward(xs)`` with ``xs`` a list of a ``(B, 5)`` and a ``(B, 2)`` tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 3), nn.Linear(2, 3)

    def forward(self, xs: list[torch.Tensor]) -> torch.Tensor:
        return self.a(xs[0]) + torch.tanh(self.b(xs[1]))


@pytest.mark.parametrize("method", METHODS)
def test_a_list_input_is_one_argument_as_in_a_plain_step(method: str) -> None:
    torch.manual_seed(0)
    model = TwoInputs().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    for batch in (4, 1, 3):
        x = [torch.randn(batch, k, generator=generator, dtype=torch.float64) for k in (5, 2)]
        y = torch.randint(0, 3, (batch,), generator=generator)
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        rows = {n: r.clone() for n, r in grads.as_dict().items()}
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        params = dict(model.named_parameters())
        plain = torch.autograd.grad(F.cross_entropy(model(x), y), list(params.values()))
        for k, (name, p) in enumerate(params.items()):
            torch.testing.assert_close(got[name], plain[k], rtol=1e-9, atol=1e-12)
            alone = [  # example i's gradient, its inputs sliced out of the list
                torch.autograd.grad(
                    F.cross_entropy(model([t[i : i + 1] for t in x]), y[i : i + 1]), p
                )[0]
                for i in range(batch)
            ]
            torch.testing.assert_close(rows[name], torch.stack(alone), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_a_model_with_nothing_trainable_is_refused_in_one_line(method: str) -> None:
    """Frozen from the start or after a call: the call is refused before any work, ``p.grad``
    as it was; unfrozen again, right (``auto`` on the last path it tried)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 4), nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 1])
    psg = make_per_sample(model.requires_grad_(False), F.cross_entropy, method)
    with pytest.raises(UnsupportedModelError, match="no trainable parameter") as error:
        psg(x, y)
    assert "\n" not in str(error.value) and all(p.grad is None for p in model.parameters())
    model.requires_grad_(True)
    psg(x, y)
    before = [p.grad.clone() for p in model.parameters()]
    model.requires_grad_(False)
    with pytest.raises(UnsupportedModelError, match="no trainable parameter"):
        psg(x, y)
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before, strict=True))
    model.requires_grad_(True)
    model.zero_grad(set_to_none=True)
    _, grads = psg(x, y)
    want = reference(model, F.cross_entropy, x, y)
    for name, row in grads.as_dict().items():
        torch.testing.assert_close(row, want.rows[name], rtol=1e-9, atol=1e-12)


class SharedWithDropout(nn.Module):
    """One Linear registered at two places (func cannot swap its parameters) and active dropout
    (loop's examples alone would draw other masks): ``auto`` has the hook path only."""

    def __init__(self) -> None:
        super().__init__()
        self.inner, self.drop, self.head = nn.Linear(5, 5), nn.Dropout(0.3), nn.Linear(5, 3)
        self.again = self.inner  # registered at a second place

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.drop(torch.tanh(self.again(torch.tanh(self.inner(x))))))


def test_auto_keeps_its_path_when_no_other_can_be_built() -> None:
    """A call the hook path refuses (a gradient hook on a parameter, then removed), where func
    and loop cannot be built for this model: auto refused in one line but had removed the hook
    path's hooks, so the next call, the hook gone, failed (a raw KeyError); now it is right."""
    torch.manual_seed(0)
    model = SharedWithDropout().double()
    psg = make_per_sample(model, F.cross_entropy, "auto")
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 1])
    psg(x, y)
    handle = model.head.weight.register_hook(lambda g: 2 * g)
    with pytest.raises(
        UnsupportedModelError, match=r"gradient hook.*\| method=func: .*\| method=loop"
    ):
        psg(x, y)
    handle.remove()
    model.zero_grad(set_to_none=True)
    state = torch.get_rng_state()
    _, grads = psg(x, y)
    torch.set_rng_state(state)  # the plain step draws the call's dropout masks again
    plain = torch.autograd.grad(F.cross_entropy(model(x), y), list(model.parameters()))
    for (name, p), want in zip(model.named_parameters(), plain, strict=True):
        torch.testing.assert_close(p.grad, want, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(grads.as_dict()[name].mean(0), want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
def test_targets_without_a_batch_are_named_as_the_targets(method: str) -> None:
    """Targets as a Python list hold no tensor: the refusal named the inputs."""
    psg = make_per_sample(nn.Sequential(nn.Linear(5, 3)).double(), F.cross_entropy, method)
    with pytest.raises(ValueError, match=r"^per-sample targets: got tensors with batch sizes \[\]"):
        psg(torch.randn(4, 5, dtype=torch.float64), [0, 1, 2, 1])


@pytest.mark.parametrize("method", METHODS)
def test_a_list_of_one_tensor_per_example_is_refused_naming_the_remedy(method: str) -> None:
    """Adversarial round 41: sequences of other lengths as a list of tensors, one per example
    (a plain step of a model that loops over them runs). Every method splits tensors along
    dimension 0, so the call is refused before any work, saying how to pass them."""
    psg = make_per_sample(nn.Sequential(nn.Linear(5, 3)).double(), F.cross_entropy, method)
    x = [torch.randn(n, 5, dtype=torch.float64) for n in (1, 2, 4)]
    with pytest.raises(ValueError, match=r"^per-sample inputs: .*\[1, 2, 4\].*pad_sequence\)$"):
        psg(x, torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("method", METHODS)
def test_a_call_under_inference_mode_is_refused_before_any_work(method: str) -> None:
    """Under ``torch.inference_mode()`` autograd records nothing: refused in one line before any
    work, ``p.grad`` as it was (auto's loop step had turned it into inference tensors, which the
    next call and even a plain ``backward()`` then failed to add to); the next call is right."""
    torch.manual_seed(0)
    model = TwoInputs().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    x = [torch.randn(4, k, generator=generator, dtype=torch.float64) for k in (5, 2)]
    y = torch.randint(0, 3, (4,), generator=generator)
    psg(x, y)
    before = [p.grad.clone() for p in model.parameters()]
    with torch.inference_mode(), pytest.raises(ValueError, match=r"inference_mode\(\)") as error:
        psg(x, y)
    assert len(str(error.value).splitlines()) == 1
    for p, grad in zip(model.parameters(), before, strict=True):
        assert not p.grad.is_inference() and torch.equal(p.grad, grad)
    model.zero_grad(set_to_none=True)
    _, grads = psg(x, y)
    for name, p in model.named_parameters():
        alone = [
            torch.autograd.grad(F.cross_entropy(model([t[i : i + 1] for t in x]), y[i : i + 1]), p)
            for i in range(4)
        ]
        want = torch.stack([g for (g,) in alone])
        torch.testing.assert_close(grads.as_dict()[name], want, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("where", ["inputs", "targets"])
def test_an_inference_tensor_given_is_refused_naming_it(method: str, where: str) -> None:
    """Inputs or targets made under ``torch.inference_mode()`` (a data pipeline's): autograd cannot
    save them, so a plain step raises too; each method raised torch's "Inference tensors do not
    track version counter" (auto an AttributeError of its own) instead of naming them."""
    model = nn.Sequential(nn.Linear(5, 3)).double()
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 1])
    with torch.inference_mode():
        made = (x.clone(), y) if where == "inputs" else (x, y.clone())
    given = "an input" if where == "inputs" else "the targets"
    with pytest.raises(ValueError, match=rf"^per-sample {given}: a tensor made under .*\(\)\)$"):
        psg(*made)
    assert all(p.grad is None for p in model.parameters())


class InferenceCount(nn.Module):
    """A count kept as an inference tensor, advanced in place under ``torch.inference_mode()``
    in each forward and read by it (a statistic a model keeps without autograd)."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(5, 6), nn.Linear(6, 3)
        with torch.inference_mode():
            self.count = torch.zeros((), dtype=torch.float64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            self.count += 1
        return self.b(torch.tanh(self.a(x)) * (1 + 0.1 * self.count.clone()))


@pytest.mark.parametrize("method", ["auto", "hooks", "factored", "loop"])
def test_an_inference_tensor_kept_on_the_model_is_put_back(method: str) -> None:
    """Every method refused such a model with torch's "Inference tensors do not track version
    counter" (the state's snapshot read its version), where a plain step runs. Now each call is
    right over 4 calls and leaves the count one higher, as a plain step does; func refuses it as
    a change to a captured tensor, as a buffer's."""
    torch.manual_seed(0)
    model, plain = InferenceCount().double(), InferenceCount().double()
    plain.load_state_dict(model.state_dict())
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.randn(4, 5, dtype=torch.float64), torch.tensor([0, 1, 2, 1])
    params = list(plain.parameters())
    for call in range(1, 5):
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        want = []  # the batch's gradient, then each example's, each from the call's count
        for xs, ys in [(x, y)] + [(x[i : i + 1], y[i : i + 1]) for i in range(4)]:
            with torch.inference_mode():
                plain.count.fill_(call - 1)
            want.append(torch.autograd.grad(F.cross_entropy(plain(xs), ys), params))
        for k, (name, p) in enumerate(model.named_parameters()):
            rows = torch.stack([alone[k] for alone in want[1:]])
            torch.testing.assert_close(grads.as_dict()[name], rows, rtol=1e-9, atol=1e-15)
            torch.testing.assert_close(p.grad, want[0][k], rtol=1e-9, atol=1e-15)
        assert model.count.item() == call and model.count.is_inference()


@pytest.mark.parametrize("method", METHODS)
def test_a_post_accumulate_hook_that_returns_a_value_is_the_users_error(method: str) -> None:
    """A fused step written ``lambda p: p.data.add_(...)`` returns a tensor, which torch refuses
    after the hook ran (a plain step raises it too): every method relayed it saying "a plain step
    of the batch raises nothing", since the plain step a refusal runs takes those hooks away
    (adversarial round 42). It is the user's error, naming the hook's parameter."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).double()
    model[2].weight.register_post_accumulate_grad_hook(lambda p: p.data.add_(p.grad, alpha=-0.01))
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.randn(4, 6, dtype=torch.float64), torch.tensor([0, 1, 2, 1])
    hook = r"^model: a post-accumulate-grad hook \(of 2\.weight\) raised RuntimeError"
    with pytest.raises(UserCodeError, match=hook):
        psg(x, y)
