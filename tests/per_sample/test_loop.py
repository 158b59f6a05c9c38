"""``method=loop`` (one example at a time, the fail-closed last resort) and ``auto``'s fall back
to it: rows equal a float64 per-example ``loss.backward()`` loop and ``p.grad`` a plain backward,
over batches of 1, 3 and 17 with one ``psg``, on models the faster paths refuse; models and
losses that mix the examples are refused in one line, ``p.grad`` left as it was."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.nn.utils.rnn import pack_padded_sequence

from grab_exp.per_sample import LoopPerSample, UnsupportedModelError, make_per_sample
from grab_exp.per_sample.layout import call_model, take

F64 = torch.float64
SIZES = (1, 3, 17)
VOCAB, PAD = 11, 0


class PackedLSTM(nn.Module):
    """Token ids ``(B, T)`` padded with 0 -> a packed LSTM's last state -> 3 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 5, padding_idx=PAD)
        self.rnn = nn.LSTM(5, 6, batch_first=True)
        self.head = nn.Linear(6, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        lengths = (ids != PAD).sum(1).clamp_min(1).cpu()  # (B,)
        packed = pack_padded_sequence(
            self.emb(ids), lengths, batch_first=True, enforce_sorted=False
        )
        _, (h, _) = self.rnn(packed)  # h: (1, B, 6)
        return self.head(h[-1])


class SparseBag(nn.Module):
    """A sparse Embedding's mean over the tokens -> 3 logits."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 5, sparse=True)
        self.head = nn.Linear(5, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


class TinyVAE(nn.Module):
    """Returns ``(logits, kl.mean())``: an auxiliary batch-mean scalar beside the output."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(4, 6)
        self.head = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mu, logvar = self.enc(x).chunk(2, dim=1)  # (B, 3) each
        kl = 0.5 * (mu**2 + logvar.exp() - 1 - logvar).sum(1)  # (B,)
        return self.head(mu), kl.mean()


class Centered(nn.Module):
    """Subtracts the batch mean of its logits: it mixes the examples."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)
        return h - h.mean(0)


def vae_loss(out, y):
    return F.cross_entropy(out[0], y) + 0.1 * out[1]


def tuple_loss(out, y):
    """``y = (labels (B,), weights (B,))``: each example's weighted loss, averaged."""
    return (y[1] * F.cross_entropy(out, y[0], reduction="none")).mean()


def ids(b: int, g: torch.Generator) -> torch.Tensor:
    """``(b, 5)`` token ids, each example padded after a length of 1 to 5."""
    x = torch.randint(1, VOCAB, (b, 5), generator=g)
    lengths = torch.randint(1, 6, (b,), generator=g)
    x[torch.arange(5)[None] >= lengths[:, None]] = PAD
    return x


def vectors(b: int, g: torch.Generator) -> torch.Tensor:
    return torch.randn(b, 4, generator=g, dtype=F64)


def labels(b: int, g: torch.Generator) -> torch.Tensor:
    return torch.randint(0, 3, (b,), generator=g)


def weighted(b: int, g: torch.Generator):
    return labels(b, g), torch.rand(b, generator=g, dtype=F64) + 0.5


CASES = {
    "packed_lstm": (PackedLSTM, ids, labels, F.cross_entropy),
    "tuple_targets": (lambda: nn.Linear(4, 3), vectors, weighted, tuple_loss),
    "sparse_embedding": (SparseBag, ids, labels, F.cross_entropy),
    "vae_kl_mean": (TinyVAE, vectors, labels, vae_loss),
}


def references(model: nn.Module, loss_fn, x, y) -> tuple[dict, dict]:
    """``(rows, grads)``: name -> ``(B, *shape)`` from one ``loss.backward()`` per example, and
    name -> ``p.grad`` of a plain backward of the batch (dense), on a copy of ``model``."""
    model = copy.deepcopy(model)
    batch = len(y[0]) if isinstance(y, tuple) else len(y)
    rows = {n: [] for n, _ in model.named_parameters()}
    for i in range(batch):
        model.zero_grad(set_to_none=True)
        loss_fn(call_model(model, take(x, [i])), take(y, [i])).backward()
        for n, p in model.named_parameters():
            g = torch.zeros_like(p) if p.grad is None else p.grad.to_dense()
            rows[n].append(g)
    model.zero_grad(set_to_none=True)
    loss_fn(call_model(model, x), y).backward()
    grads = {n: p.grad.to_dense() for n, p in model.named_parameters()}
    return {n: torch.stack(r) for n, r in rows.items()}, grads


def build(make) -> nn.Module:
    torch.manual_seed(0)
    return make().double()


@pytest.mark.parametrize("name", list(CASES))
def test_loop_equals_the_per_example_loop_and_a_plain_backward(name):
    make, inputs, targets, loss_fn = CASES[name]
    model, g = build(make), torch.Generator().manual_seed(1)
    psg = make_per_sample(model, loss_fn, "loop")
    assert isinstance(psg, LoopPerSample) and psg.method == "loop"
    for b in SIZES:
        x, y = inputs(b, g), targets(b, g)
        want_rows, want_grads = references(model, loss_fn, x, y)
        model.zero_grad(set_to_none=True)
        loss, grads = psg(x, y)
        got = grads.as_dict()
        assert list(got) == list(want_rows)
        for n, want in want_rows.items():
            torch.testing.assert_close(got[n], want, atol=1e-12, rtol=1e-10, msg=f"B={b} {n}")
            p = model.get_parameter(n)
            torch.testing.assert_close(p.grad.to_dense(), want_grads[n], atol=1e-12, rtol=1e-10)
        assert loss.shape == () and not loss.requires_grad


def test_loop_leaves_buffers_and_the_generator_as_the_batch_step_does():
    """Running statistics of a norm in eval mode, a counter buffer and the generator: as after
    one plain forward of the batch (the per-example forwards leave no trace)."""

    class Counting(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(4, 3)
            self.register_buffer("calls", torch.zeros((), dtype=torch.long))

        def forward(self, x):
            self.calls += 1
            return self.fc(x)

    model, g = build(Counting), torch.Generator().manual_seed(2)
    psg = make_per_sample(model, F.cross_entropy, "loop")
    x, y = vectors(5, g), labels(5, g)
    state = torch.get_rng_state()
    psg(x, y)
    assert int(model.calls) == 1
    assert torch.equal(torch.get_rng_state(), state)


def _refused(psg, model, x, y, match: str) -> None:
    """``psg(x, y)`` is refused in one line matching ``match`` (a ``ValueError``: the base's
    module check, or an ``UnsupportedModelError``); ``p.grad`` as before."""
    before = {n: torch.full_like(p, 0.25) for n, p in model.named_parameters()}
    for n, p in model.named_parameters():
        p.grad = before[n].clone()
    with pytest.raises(ValueError, match=match) as error:
        psg(x, y)
    assert "\n" not in str(error.value)
    for n, p in model.named_parameters():
        assert torch.equal(p.grad, before[n]), n


@pytest.mark.parametrize(
    ("layer", "error", "message", "seed"),
    [
        (lambda: nn.BatchNorm1d(6), ValueError, r"^1 \(BatchNorm1d\) in training mode", 3),
        (lambda: nn.Dropout(0.3), UnsupportedModelError, r"^1 \(Dropout\) draws random numbers", 6),
    ],
    ids=["batchnorm", "dropout"],
)
def test_a_module_unfit_in_training_mode_is_refused_naming_it(layer, error, message, seed):
    model = build(lambda: nn.Sequential(nn.Linear(4, 6), layer(), nn.Linear(6, 3)))
    with pytest.raises(error, match=message):
        make_per_sample(model, F.cross_entropy, "loop")
    model.eval()
    psg = make_per_sample(model, F.cross_entropy, "loop")
    model.train()
    g = torch.Generator().manual_seed(seed)
    _refused(psg, model, vectors(6, g), labels(6, g), message)


def test_a_model_that_mixes_the_examples_is_refused_by_the_rows_mean():
    model, g = build(Centered), torch.Generator().manual_seed(4)
    psg = make_per_sample(model, F.cross_entropy, "loop")
    x, y = vectors(6, g), labels(6, g)
    _refused(psg, model, x, y, r"^the rows' mean differs from autograd's gradient at fc\.")


def test_a_class_weighted_mean_loss_is_refused_by_the_rows_mean():
    weight = torch.tensor([1.0, 3.0, 0.2], dtype=F64)

    def loss_fn(out, y):
        return F.cross_entropy(out, y, weight=weight)

    model = build(lambda: nn.Linear(4, 3))
    psg = make_per_sample(model, loss_fn, "loop")
    x, y = vectors(6, torch.Generator().manual_seed(5)), torch.tensor([0, 1, 2, 0, 1, 2])
    _refused(psg, model, x, y, r"^the rows' mean differs .* class weight=")


def test_loop_cannot_be_compiled():
    with pytest.raises(ValueError, match=r"got 'loop' with trainer\.compile=true; allowed: auto"):
        make_per_sample(nn.Linear(4, 3), F.cross_entropy, "loop", compile_mode="default")


@pytest.mark.parametrize("name", ["packed_lstm"])
def test_auto_falls_back_to_loop_with_one_warning(name):
    make, inputs, targets, loss_fn = CASES[name]
    model, g = build(make), torch.Generator().manual_seed(7)
    psg = make_per_sample(model, loss_fn)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_right_over(psg, model, loss_fn, inputs, targets, g, SIZES)
    ours = [str(w.message) for w in caught if "method=loop" in str(w.message)]
    assert psg.method == "loop" and len(ours) == 1, ours
    assert ours[0].startswith("method=auto takes method=loop (method=")
    assert "| method=func: " in ours[0] and "B forward and backward passes" in ours[0]


@pytest.mark.parametrize("method", ["hooks", "factored"])
def test_the_hook_path_refuses_a_packed_sequence_naming_it(method):
    """Round 38: the hook path called a packed LSTM's input a selection of the examples, or
    relayed torch's shape error where the first example had length 1; it names the input."""
    make, inputs, targets, loss_fn = CASES["packed_lstm"]
    model, g = build(make), torch.Generator().manual_seed(7)
    psg = make_per_sample(model, loss_fn, method)
    with pytest.raises(UnsupportedModelError, match=r"^rnn \(LSTM\): its input is a PackedSeq"):
        psg(inputs(3, g), targets(3, g))
    assert all(p.grad is None for p in model.parameters())


def test_auto_refuses_in_one_line_with_every_methods_reason():
    model, g = build(Centered), torch.Generator().manual_seed(8)
    psg = make_per_sample(model, F.cross_entropy)
    x, y = vectors(6, g), labels(6, g)
    _refused(psg, model, x, y, r"^method=(hooks|factored): .* \| method=func: .* \| method=loop: ")


@pytest.mark.parametrize("method", ["hooks", "factored", "func", "loop"])
def test_tuple_targets_on_every_method(method):
    """``y = (labels, weights)``: the checks slice the targets leaf by leaf (an IndexError of
    ``y[i:i+1]`` on a tuple before), over batches of 1, 3 and 17 and the loss split between."""
    make, inputs, targets, loss_fn = CASES["tuple_targets"]
    model, g = build(make), torch.Generator().manual_seed(9)
    psg = make_per_sample(model, loss_fn, method)
    # 40: vmapped example losses; the second 17: an unchecked call
    assert_right_over(psg, model, loss_fn, inputs, targets, g, (*SIZES, 40, 17))


def assert_right_over(psg, model, loss_fn, inputs, targets, g, sizes) -> None:
    """Each call's rows and ``p.grad`` (dense) against the references, over ``sizes``."""
    for b in sizes:
        x, y = inputs(b, g), targets(b, g)
        want_rows, want_grads = references(model, loss_fn, x, y)
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        for n, rows in grads.as_dict().items():
            torch.testing.assert_close(rows, want_rows[n], atol=1e-12, rtol=1e-10)
            torch.testing.assert_close(model.get_parameter(n).grad.to_dense(), want_grads[n])


class RootScaled(nn.Module):
    """A parameter of the root module (the hook path is ruled out by structure) and a
    ``.item()`` in the forward (torch.func's vmap cannot batch it)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.scale = nn.Parameter(torch.ones(3))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc(x)  # (B, 3)
        return h * self.scale if x.sum().item() > -1e9 else h


def test_auto_without_the_hook_path_goes_from_func_to_loop():
    model, g = build(RootScaled), torch.Generator().manual_seed(10)
    psg = make_per_sample(model, F.cross_entropy)
    assert psg.method == "func"
    x, y = vectors(5, g), labels(5, g)
    want_rows, want_grads = references(model, F.cross_entropy, x, y)
    with pytest.warns(UserWarning, match=r"^method=auto takes method=loop \(method=hooks: the ro"):
        _, grads = psg(x, y)
    assert psg.method == "loop" and psg.reason.startswith("method=hooks: the root module")
    for n, rows in grads.as_dict().items():
        torch.testing.assert_close(rows, want_rows[n], atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(model.get_parameter(n).grad, want_grads[n])


def test_loop_gives_uninitialized_lazy_layers_their_shape_from_the_first_example():
    """The rows are made once the examples ran: a LazyLinear has its shape by then (before, every
    call was refused: "Can't access the shape of an uninitialized parameter")."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.LazyLinear(6), nn.Tanh(), nn.LazyLinear(3)).double()
    psg = make_per_sample(model, F.cross_entropy, "loop")
    g = torch.Generator().manual_seed(2)
    for b in (4, 1, 5):
        x = torch.randn(b, 5, generator=g, dtype=torch.float64)
        y = torch.randint(0, 3, (b,), generator=g)
        model.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        got = {n: r.clone() for n, r in grads.as_dict().items()}
        grad = {n: p.grad.clone() for n, p in model.named_parameters()}
        want_rows, want_grads = references(model, F.cross_entropy, x, y)  # now materialized
        for n, want in want_rows.items():
            torch.testing.assert_close(got[n], want, atol=1e-12, rtol=1e-10, msg=f"B={b} {n}")
            torch.testing.assert_close(grad[n], want_grads[n], atol=1e-12, rtol=1e-10)
