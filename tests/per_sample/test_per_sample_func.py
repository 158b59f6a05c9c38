"""The torch.func path (grab_exp.per_sample.func) against per-example loops of backward()."""

from __future__ import annotations

from contextlib import nullcontext

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.parametrizations import spectral_norm

from grab_exp.grads import flatten_grads
from grab_exp.per_sample import FuncPerSample, UnsupportedModelError, make_per_sample

ATOL = 1e-10


class BufferNet(nn.Module):
    """Linear model whose forward uses registered buffers (a fixed input normalization)."""

    def __init__(self, d_in: int = 6, n_out: int = 3) -> None:
        super().__init__()
        self.register_buffer("shift", torch.linspace(-1.0, 1.0, d_in))
        self.register_buffer("scale", torch.linspace(0.5, 2.0, d_in))
        self.fc = nn.Linear(d_in, n_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc((x - self.shift) * self.scale)


def linear_net() -> nn.Module:
    return nn.Sequential(nn.Linear(6, 5), nn.Tanh(), nn.Linear(5, 3))


def conv_net() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(2, 3, kernel_size=3, padding=1),
        nn.ReLU(),
        nn.Conv2d(3, 4, kernel_size=3, stride=2),
        nn.Flatten(),
        nn.Linear(4 * 2 * 2, 3),
    )


def bn_net() -> nn.Module:
    features = nn.Sequential(
        nn.Conv2d(2, 3, kernel_size=3), nn.ReLU(), nn.Conv2d(3, 3, 1), nn.BatchNorm2d(3)
    )
    return nn.Sequential(features, nn.Flatten(), nn.Linear(3 * 3 * 3, 3))


def dropout_net(p: float = 0.5) -> nn.Module:
    return nn.Sequential(nn.Linear(6, 5), nn.ReLU(), nn.Dropout(p), nn.Linear(5, 3))


SMALL = {
    "linear": (linear_net, (6,)),
    "conv": (conv_net, (2, 5, 5)),
    "buffer": (BufferNet, (6,)),
}


def make_batch(shape: tuple[int, ...], n: int = 7, classes: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, *shape, generator=g, dtype=torch.float64)
    y = torch.randint(0, classes, (n,), generator=g)
    return x, y


def loop_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
    """Reference: one ordinary backward() per example, stacked to (B, *param.shape)."""
    rows = []
    for i in range(x.shape[0]):
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        rows.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    model.zero_grad(set_to_none=True)
    return {n: torch.stack([r[n] for r in rows]) for n in rows[0]}


def assert_grads_close(got: dict, want: dict, atol: float = ATOL) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].shape == want[name].shape, name
        torch.testing.assert_close(got[name], want[name], atol=atol, rtol=0, msg=name)


def func_grads(model: nn.Module, x: torch.Tensor, y: torch.Tensor, **options) -> tuple:
    """``(loss, name -> (B, *shape))`` of ``method=func`` (``param.grad`` reset afterwards)."""
    loss, grads = FuncPerSample(model, F.cross_entropy, **options)(x, y)
    model.zero_grad(set_to_none=True)
    return loss, grads.as_dict()


def seeded(factory, *args):
    torch.manual_seed(0)
    return factory(*args).double()


@pytest.mark.parametrize("name", list(SMALL))
def test_small_models_match_per_example_loop(name):
    factory, shape = SMALL[name]
    model = seeded(factory)
    x, y = make_batch(shape)
    loss, grads = func_grads(model, x, y)
    assert_grads_close(grads, loop_grads(model, x, y))
    torch.testing.assert_close(loss, F.cross_entropy(model(x), y), atol=ATOL, rtol=0)
    assert loss.shape == () and not loss.requires_grad


@pytest.mark.parametrize("name", ["LeNet", "MLP", "LogReg"])
def test_project_models_match_per_example_loop(name):
    import grab_exp.models as models

    model = seeded(getattr(models, name))
    x, y = make_batch((3, 32, 32), n=4, classes=10)
    _, grads = func_grads(model, x, y)
    assert_grads_close(grads, loop_grads(model, x, y))


@pytest.mark.parametrize("name", list(SMALL))
def test_mean_equals_batched_backward(name):
    factory, shape = SMALL[name]
    model = seeded(factory)
    x, y = make_batch(shape)
    F.cross_entropy(model(x), y).backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    FuncPerSample(model, F.cross_entropy)(x, y)  # the same call writes the mean
    assert_grads_close({n: p.grad for n, p in model.named_parameters()}, want)


def test_the_mean_adds_to_grad_like_backward_and_drives_an_optimizer():
    model = seeded(linear_net)
    x, y = make_batch((6,))
    psg = FuncPerSample(model, F.cross_entropy)
    psg(x, y)
    first = {n: p.grad.clone() for n, p in model.named_parameters()}
    psg(x, y)
    for n, p in model.named_parameters():
        torch.testing.assert_close(p.grad, 2 * first[n], atol=ATOL, rtol=0)
    before = [p.detach().clone() for p in model.parameters()]
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(not torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))


def test_chunk_size_gives_identical_results():
    model = seeded(conv_net)
    x, y = make_batch((2, 5, 5), n=8)
    loss_full, full = func_grads(model, x, y)
    # Chunks smaller than the batch change only the batched kernels' float64 rounding (~1e-17).
    for chunk, atol in ((1, 1e-14), (3, 1e-14), (8, 0.0), (100, 0.0)):
        loss_c, chunked = func_grads(model, x, y, chunk_size=chunk)
        assert_grads_close(chunked, full, atol=atol)
        torch.testing.assert_close(loss_c, loss_full, atol=atol, rtol=0)


@pytest.mark.parametrize("bad", [0, -2, 1.5])
def test_invalid_chunk_size_is_rejected(bad):
    with pytest.raises(ValueError, match="chunk_size"):
        FuncPerSample(linear_net(), F.cross_entropy, chunk_size=bad)


def test_batchnorm_in_training_mode_is_an_error_naming_the_module():
    model = nn.Sequential()
    model.add_module("features", bn_net()[0])
    with pytest.raises(ValueError, match=r"features\.3 \(BatchNorm2d\) in training mode"):
        FuncPerSample(model, F.cross_entropy)


def test_batchnorm_switched_to_training_after_construction_is_caught():
    model = seeded(bn_net).eval()
    psg = FuncPerSample(model, F.cross_entropy)
    model.train()
    with pytest.raises(ValueError, match=r"0\.3 \(BatchNorm2d\)"):
        psg(*make_batch((2, 5, 5)))


def test_batchnorm_without_running_stats_is_an_error_even_in_eval():
    model = nn.Sequential(nn.Linear(6, 4), nn.BatchNorm1d(4, track_running_stats=False)).eval()
    with pytest.raises(ValueError, match=r"1 \(BatchNorm1d\) without running statistics"):
        FuncPerSample(model, F.cross_entropy)


def test_batchnorm_in_eval_mode_uses_buffers_and_matches_loop():
    model = seeded(bn_net)
    bn = model[0][3]
    with torch.no_grad():
        bn.running_mean.uniform_(-1.0, 1.0)
        bn.running_var.uniform_(0.5, 2.0)
    model.eval()
    x, y = make_batch((2, 5, 5))
    _, grads = func_grads(model, x, y)
    assert_grads_close(grads, loop_grads(model, x, y))


@pytest.mark.parametrize(
    "cls", [nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.AlphaDropout, nn.FeatureAlphaDropout]
)
def test_dropout_without_randomness_is_an_error_naming_the_module(cls):
    model = nn.Sequential(nn.Linear(6, 5), cls(0.3), nn.Linear(5, 3))
    with pytest.raises(ValueError, match=rf"1 \({cls.__name__}\) with p=0.3 .*randomness"):
        FuncPerSample(model, F.cross_entropy)


def test_dropout_is_allowed_in_eval_mode_or_with_p_zero():
    x, y = make_batch((6,))
    FuncPerSample(seeded(dropout_net).eval(), F.cross_entropy)(x, y)
    FuncPerSample(seeded(dropout_net, 0.0), F.cross_entropy)(x, y)


@pytest.mark.parametrize("randomness", ["different", "same"])
def test_dropout_with_explicit_randomness_works(randomness):
    model = seeded(dropout_net)
    x, y = make_batch((6,), n=64)
    loss, grads = FuncPerSample(model, F.cross_entropy, randomness=randomness)(x, y)
    flat = grads.dense().matrix
    assert flat.shape == (64, sum(p.numel() for p in model.parameters()))
    assert torch.isfinite(flat).all() and torch.isfinite(loss)
    # With "same" every example sees one mask: the first layer's bias gradients share a zero pattern
    zero_rows = grads.as_dict()["0.bias"] == 0  # (B, 5)
    assert (zero_rows.all(dim=0) == zero_rows.any(dim=0)).all().item() is (randomness == "same")


@pytest.mark.parametrize("bad", ["error", "Different", "random", ""])
def test_invalid_randomness_names_setting_and_allowed_values(bad):
    with pytest.raises(ValueError, match=r"randomness: got .*; allowed: different, same"):
        FuncPerSample(linear_net(), F.cross_entropy, randomness=bad)


def test_flatten_is_b_by_d_in_named_parameters_order():
    model = seeded(conv_net)
    x, y = make_batch((2, 5, 5), n=5)
    _, grads = FuncPerSample(model, F.cross_entropy)(x, y)
    flat = grads.dense().matrix
    d = sum(p.numel() for p in model.parameters())
    assert flat.shape == (5, d)
    assert torch.equal(flat, flatten_grads(grads.as_dict(), d))
    start = 0
    for name, p in model.named_parameters():
        block = flat[:, start : start + p.numel()].reshape(5, *p.shape)
        assert torch.equal(block, grads.as_dict()[name]), name
        start += p.numel()
    assert start == d


def test_frozen_parameters_are_excluded():
    model = seeded(linear_net)
    model[0].weight.requires_grad_(False)
    x, y = make_batch((6,))
    _, grads = FuncPerSample(model, F.cross_entropy)(x, y)
    assert model[0].weight.grad is None and model[0].bias.grad is not None
    assert list(grads.shapes) == ["0.bias", "2.weight", "2.bias"]
    assert grads.dense().matrix.shape == (7, 5 + 15 + 3)
    assert_grads_close(grads.as_dict(), loop_grads(model, x, y))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_step_is_sync_free():
    model = seeded(conv_net).float().cuda()
    x, y = (t.cuda() for t in make_batch((2, 5, 5), n=16))
    x = x.float()
    psg = FuncPerSample(model, F.cross_entropy, chunk_size=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    psg(x, y)  # warm-up outside the check (lazy CUDA initialization may synchronize)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(2):
            opt.zero_grad()
            loss, grads = psg(x, y)
            grads.dense()
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss).item()


class ItemNet(nn.Module):
    """A Linear layer whose forward reads a value on the host (``.item()``), which vmap cannot."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * (2.0 if x.sum().item() > 0 else 1.0)


def _gaussian_nll(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The mean Gaussian NLL of ``y`` under ``out[:, 0]`` and variance ``exp(out[:, 1])``
    (torch checks the variance's sign on the host, which vmap cannot)."""
    return F.gaussian_nll_loss(out[:, 0], y, out[:, 1].exp())


@pytest.mark.parametrize(
    ("model", "loss_fn", "y", "named"),
    [
        (lambda: nn.Linear(6, 2), _gaussian_nll, torch.randn(4), "loss_fn"),
        (ItemNet, F.cross_entropy, torch.tensor([0, 1, 1, 0]), "this model"),
    ],
)
def test_a_vmap_failure_names_the_loss_or_the_model_where_it_was_raised(model, loss_fn, y, named):
    """A loss that vmap cannot run was refused as the model's failure: the refusal names
    ``loss_fn`` when the error was raised inside it, the model otherwise, in one line."""
    torch.manual_seed(0)
    with pytest.raises(ValueError, match=rf"^torch\.func's vmap failed on {named} \(") as error:
        FuncPerSample(model(), loss_fn)(torch.randn(4, 6), y)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize("parametrized", [False, True])
def test_a_buffer_the_forward_updates_names_the_methods_that_take_the_model(parametrized):
    """A forward that updates a buffer in place is refused by ``func``, naming the methods that
    take the model: ``hooks`` or ``loop`` for a counter, ``loop`` alone for spectral_norm's
    power-iteration vector (the hook path refuses parametrized layers), which ``auto`` takes."""
    torch.manual_seed(0)
    first = spectral_norm(nn.Linear(4, 4)) if parametrized else Counted()
    model = nn.Sequential(first, nn.Tanh(), nn.Linear(4, 3)).double()
    x, y = torch.randn(5, 4, dtype=torch.float64), torch.randint(0, 3, (5,))
    takes = r"loop \(auto takes it\)" if parametrized else r"hooks or loop \(auto takes them\)"
    with pytest.raises(UnsupportedModelError, match=rf"in place .*; use method={takes}$"):
        make_per_sample(model, F.cross_entropy, "func")(x, y)
    with pytest.warns(UserWarning, match="method=loop") if parametrized else nullcontext():
        psg = make_per_sample(model, F.cross_entropy, "auto")
        psg(x, y)
    assert psg.method == ("loop" if parametrized else "factored")


class Counted(nn.Linear):
    """A Linear that counts its calls in a buffer."""

    def __init__(self) -> None:
        super().__init__(4, 4)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        self.calls += 1
        return super().forward(x)
