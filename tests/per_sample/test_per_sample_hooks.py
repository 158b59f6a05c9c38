"""The hook path (grab_exp.per_sample.hooks): exactness, its fast paths and the reused buffer.

Per-sample gradients and ``param.grad`` equal a per-example loop (float64). ``reuse_buffer=True``
returns views of one ``(B, d)`` buffer that the orderings take without a copy; ``param.grad`` is
autograd's, as from ``loss.backward()``, also where outputs are changed in place.
"""

from __future__ import annotations

import gc
import warnings

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.checkpoint import checkpoint

from grab_exp.balance import make_ordering
from grab_exp.grads import flatten_grads
from grab_exp.models import MLP, LeNet, LogReg
from grab_exp.per_sample import (
    HookedPerSample,
    PerSamplePipeline,
    UnsupportedModelError,
    check_supported,
    make_per_sample,
)


def call(psg, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, dict]:
    """``psg(x, y)`` with the gradients as name -> ``(B, *shape)`` (views of a reused buffer)."""
    loss, grads = psg(x, y)
    return loss, grads.as_dict()


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
    loss, grads = call(HookedPerSample(model, F.cross_entropy), x, y)
    assert list(grads) == [n for n, _ in model.named_parameters()]
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], expected[name], atol=1e-12, rtol=1e-10)
        torch.testing.assert_close(p.grad, expected[name].mean(0), atol=1e-12, rtol=1e-10)
    assert loss.item() == pytest.approx(F.cross_entropy(model(x), y).item())


class ListNet(nn.Module):
    """A parameter in an ``nn.ParameterList``: used by its parent's forward, not its own."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3072, 10)
        self.scales = nn.ParameterList([nn.Parameter(torch.ones(10))])

    def forward(self, x):
        return self.fc(x.flatten(1)) * self.scales[0]


def test_auto_picks_a_path_by_structure_and_parameters_used_by_a_parent_are_adopted():
    # LayerNorm has a rule and GroupNorm gets the per-layer fallback: both are hooks now (with
    # the Linear layers, 99% of the weights, factored)
    for norm in (nn.LayerNorm(8), nn.GroupNorm(2, 8)):
        model = nn.Sequential(nn.Flatten(), nn.Linear(3072, 8), norm, nn.Linear(8, 10))
        assert PerSamplePipeline(model, F.cross_entropy, method="auto").method == "factored"
    # a ParameterList never runs: the root's replay differentiates it, which func does in one
    # pass, so auto takes func; hooks themselves are right
    assert PerSamplePipeline(ListNet(), F.cross_entropy, method="auto").method == "func"
    model = ListNet().double()
    x, y = torch.randn(4, 3, 32, 32, dtype=torch.float64), torch.arange(4) % 10
    expected = per_example_loop(model, x, y)
    hooked = HookedPerSample(model, F.cross_entropy)
    _, grads = call(hooked, x, y)
    assert set(hooked.registry.fallbacks) == {""} and hooked.registry.fallbacks[""].adopted == [
        "scales.0"
    ]
    for name, want in expected.items():
        torch.testing.assert_close(grads[name], want, rtol=1e-10, atol=1e-12)
    assert PerSamplePipeline(LeNet(), F.cross_entropy, method="auto").method == "factored"
    # an ordering that materializes factors anyway (recursive): auto keeps the hook path's rows
    unread = PerSamplePipeline(LeNet(), F.cross_entropy, method="auto", factors=False)
    assert unread.method == "hooks"


def test_auto_materializes_when_layers_without_factors_hold_many_weights():
    # the convolution holds 896 of 1,922 weights (> 1/8): the reused buffer's one matrix
    model = nn.Sequential(nn.Conv2d(3, 32, 3, stride=8), nn.Flatten(), nn.Linear(512, 2))
    assert PerSamplePipeline(model, F.cross_entropy, method="auto").method == "hooks"
    # without a reused buffer the Linear keeps its factors: hooks would write its block anew
    assert make_per_sample(model, F.cross_entropy).method == "factored"
    assert make_per_sample(model, F.cross_entropy, reuse_buffer=True).method == "hooks"
    no_factors = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LayerNorm(3600))
    assert make_per_sample(no_factors, F.cross_entropy).method == "hooks"


def test_batchnorm_in_training_mode_is_refused_by_name():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.Flatten(), nn.LazyLinear(10))
    with pytest.raises(ValueError, match=r"1 \(BatchNorm2d\)"):
        HookedPerSample(model, F.cross_entropy)


def test_pipeline_method_is_validated():
    with pytest.raises(ValueError, match=r"^pipeline.method: got 'fast'; allowed: auto, factored"):
        PerSamplePipeline(LeNet(), F.cross_entropy, method="fast")


def test_hook_and_func_pipelines_train_the_same():
    torch.manual_seed(1)
    x, y = torch.randn(16, 3, 32, 32, dtype=torch.float64), torch.randint(0, 10, (16,))
    results = []
    for method in ("func", "hooks"):
        torch.manual_seed(2)
        model = LeNet().double()
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        pipeline = PerSamplePipeline(model, F.cross_entropy, method=method)
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            pipeline(x, y)
            opt.step()
        results.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    torch.testing.assert_close(results[0], results[1], atol=1e-10, rtol=1e-9)


class InPlaceNet(nn.Module):
    """In-place ReLUs on a Conv2d's and a Linear's outputs, and a Linear called twice."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 5, stride=3)
        self.fc = nn.Linear(400, 10)
        self.act = nn.ReLU(inplace=True)
        self.twice = nn.Linear(10, 10)

    def forward(self, x):
        h = self.act(self.conv(x)).flatten(1)  # (B, 400)
        h = self.act(self.fc(h))
        return self.twice(h) if self.training else self.twice(self.twice(h))


def batch(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 3, 32, 32, generator=g, dtype=torch.float64)  # (B, 3, 32, 32)
    return x, torch.randint(0, 10, (rows,), generator=g)  # (B,)


def width(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def hooked_pair(make_model):
    """The same float64 model twice: per-sample gradients without and with the buffer."""
    torch.manual_seed(0)
    plain = make_model().double()
    buffered = make_model().double()
    buffered.load_state_dict(plain.state_dict())
    return (
        (plain, HookedPerSample(plain, F.cross_entropy)),
        (buffered, HookedPerSample(buffered, F.cross_entropy, reuse_buffer=True)),
    )


@pytest.mark.parametrize("make_model", [LeNet, MLP, LogReg])
def test_buffer_views_equal_the_fresh_tensors_exactly(make_model):
    (plain, fresh), (buffered, reused) = hooked_pair(make_model)
    x, y = batch(6, seed=1)
    loss_a, expected = call(fresh, x, y)
    loss_b, grads = call(reused, x, y)
    assert list(grads) == list(expected) == [n for n, _ in buffered.named_parameters()]
    assert torch.equal(loss_a, loss_b)
    for name, g in grads.items():
        assert torch.equal(g, expected[name]), name
        assert (
            g.untyped_storage().data_ptr() == reused.grad_buffer.buffer.untyped_storage().data_ptr()
        )
    for p, q in zip(plain.parameters(), buffered.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-14, atol=1e-16)  # sums' order


@pytest.mark.parametrize("make_model", [LeNet, LogReg])
def test_flatten_returns_the_buffer_without_a_copy(make_model):
    _, (model, reused) = hooked_pair(make_model)
    _, grads = call(reused, *batch(5, seed=2))
    flat = flatten_grads(grads, width(model))  # (B, d)
    assert flat.data_ptr() == reused.grad_buffer.buffer.data_ptr()
    assert flat.shape == (5, width(model)) and flat.is_contiguous()
    assert reused(*batch(5, seed=2))[1].dense().matrix.data_ptr() == flat.data_ptr()
    expected = torch.cat([g.reshape(5, -1) for g in grads.values()], dim=1)
    assert torch.equal(flat, expected)


def test_a_second_call_overwrites_the_first_ones_tensors():
    (_, fresh), (_, reused) = hooked_pair(LeNet)
    _, first = call(reused, *batch(8, seed=3))
    pointers = {n: g.data_ptr() for n, g in first.items()}
    x, y = batch(8, seed=4)
    _, second = call(reused, x, y)
    _, expected = call(fresh, x, y)
    for name, g in second.items():
        assert g.data_ptr() == pointers[name]
        assert torch.equal(g, expected[name]) and torch.equal(first[name], expected[name])


def test_a_smaller_last_batch_uses_the_first_rows():
    (_, fresh), (model, reused) = hooked_pair(MLP)
    reused(*batch(8, seed=5))
    buffer = reused.grad_buffer.buffer
    x, y = batch(3, seed=6)
    _, grads = call(reused, x, y)
    _, expected = call(fresh, x, y)
    assert reused.grad_buffer.buffer is buffer
    assert all(torch.equal(g, expected[n]) for n, g in grads.items())
    assert flatten_grads(grads, width(model)).data_ptr() == buffer.data_ptr()
    _, grads = reused(*batch(12, seed=7))  # a larger batch: a new buffer
    assert reused.grad_buffer.buffer.shape == (12, width(model))


def test_frozen_parameters_are_left_out_of_the_buffer():
    _, (model, _) = hooked_pair(LeNet)
    model.conv1.bias.requires_grad_(False)
    model.fc3.weight.requires_grad_(False)
    reused = HookedPerSample(model, F.cross_entropy, reuse_buffer=True)
    fresh = HookedPerSample(model, F.cross_entropy)
    x, y = batch(4, seed=8)
    _, grads = call(reused, x, y)
    model.zero_grad(set_to_none=True)
    _, expected = call(fresh, x, y)
    assert list(grads) == list(expected) and "conv1.bias" not in grads
    assert all(torch.equal(g, expected[n]) for n, g in grads.items())
    assert flatten_grads(grads, width(model)).data_ptr() == reused.grad_buffer.buffer.data_ptr()
    model.conv1.bias.requires_grad_(True)  # unfrozen after construction: a new layout
    _, grads = call(reused, x, y)
    assert "conv1.bias" in grads and reused.grad_buffer.buffer.shape == (4, width(model))
    assert flatten_grads(grads, width(model)).data_ptr() == reused.grad_buffer.buffer.data_ptr()


def test_other_layouts_are_concatenated():
    _, (model, reused) = hooked_pair(LogReg)
    _, grads = call(reused, *batch(4, seed=9))
    swapped = dict(reversed(list(grads.items())))  # blocks out of order: a copy, in dict order
    flat = flatten_grads(swapped, width(model))
    assert flat.data_ptr() != reused.grad_buffer.buffer.data_ptr()
    assert torch.equal(flat, torch.cat([g.reshape(4, -1) for g in swapped.values()], dim=1))
    matrix = torch.zeros(4, 10)  # (B, d): blocks of a matrix wider than d are not one
    parts = {"a": matrix[:, :3], "b": matrix[:, 3:5]}
    assert flatten_grads(parts, 5).data_ptr() != matrix.data_ptr()


def test_the_ordering_steps_on_the_buffer_as_on_a_copy():
    _, (model, reused) = hooked_pair(LeNet)
    orderings = [make_ordering("mean", 12, width(model), dtype=torch.float64) for _ in range(2)]
    for step in range(3):
        _, grads = call(reused, *batch(4, seed=10 + step))
        orderings[0].step(grads)
        orderings[1].step({n: g.clone() for n, g in grads.items()})
    assert torch.equal(orderings[0].acc, orderings[1].acc)
    assert torch.equal(orderings[0].keys, orderings[1].keys)


def test_the_functional_pipeline_reuses_the_buffer_by_default():
    assert PerSamplePipeline(LeNet(), F.cross_entropy, method="hooks").per_sample.reuse_buffer
    pipeline = PerSamplePipeline(LeNet(), F.cross_entropy, method="hooks", reuse_buffer=False)
    assert not pipeline.per_sample.reuse_buffer


def test_outputs_changed_in_place_are_right():
    torch.manual_seed(0)
    model = InPlaceNet().double()
    x, y = batch(5, seed=11)
    expected = per_example_loop(model, x, y)
    model.zero_grad(set_to_none=True)
    hooked = HookedPerSample(model, F.cross_entropy, reuse_buffer=True)
    _, grads = call(hooked, x, y)
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(p.grad, expected[name].mean(0), rtol=1e-10, atol=1e-12)


def test_a_layer_called_twice_sums_its_calls():
    torch.manual_seed(0)
    model = InPlaceNet().double().eval()  # eval: self.twice runs twice
    x, y = batch(5, seed=12)
    expected = per_example_loop(model, x, y)
    model.zero_grad(set_to_none=True)
    hooked = HookedPerSample(model, F.cross_entropy)
    _, grads = call(hooked, x, y)
    assert len(hooked.planner.plan.layouts["twice"]) == 2
    for name, p in model.named_parameters():
        torch.testing.assert_close(grads[name], expected[name], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(p.grad, expected[name].mean(0), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("make_model", [LeNet, MLP])
def test_mean_gradients_add_to_grad_like_backward(make_model):
    torch.manual_seed(0)
    model = make_model().double()
    x, y = batch(6, seed=13)
    F.cross_entropy(model(x), y).backward()
    expected = {n: 2 * p.grad for n, p in model.named_parameters()}
    hooked = HookedPerSample(model, F.cross_entropy, reuse_buffer=True)
    hooked(x, y)  # adds the same mean gradient again
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], rtol=1e-12, atol=1e-14)
    x.requires_grad_(True)  # x gets its .grad too, as from loss.backward()
    hooked(x, y)
    assert x.grad is not None and x.grad.shape == x.shape


def test_tied_weights_are_left_to_the_func_path():
    first, second = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
    second.weight = first.weight  # tied: the hooks of one layer would miss the other's use
    model = torch.nn.Sequential(first, torch.nn.ReLU(), second)
    with pytest.raises(UnsupportedModelError, match="shares a parameter with 0"):
        check_supported(model)
    assert PerSamplePipeline(model, torch.nn.functional.cross_entropy).method == "func"


class CheckpointedLayer(nn.Module):
    """A layer without a rule whose forward checkpoints itself (saved-tensor hooks)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(6, 6))

    def forward(self, x):
        return checkpoint(lambda t: torch.tanh(t @ self.weight), x, use_reentrant=False)


def test_a_layer_vmap_cannot_replay_is_replayed_by_plain_autograd_per_example():
    """torch.func refuses saved-tensor hooks: the fallback's loop differentiates each example's
    replay with plain autograd, over several batches (B = 1 included)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), CheckpointedLayer(), nn.Linear(6, 10)).double()
    hooked = HookedPerSample(model, F.cross_entropy)
    for rows, seed in ((5, 21), (1, 22), (7, 23)):
        x, y = torch.randn(rows, 4, dtype=torch.float64), torch.arange(rows) % 10
        torch.manual_seed(seed)
        expected = per_example_loop(model, x, y)
        model.zero_grad(set_to_none=True)
        _, grads = call(hooked, x, y)
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], expected[name], rtol=1e-10, atol=1e-12)
            torch.testing.assert_close(p.grad, expected[name].mean(0), rtol=1e-10, atol=1e-12)
    assert hooked.registry.fallbacks["1"].batched_by == "loop"


class CountedTanh(nn.Module):
    """A layer without a rule whose output scales with a count of its calls kept in a buffer
    (while ``counting``)."""

    def __init__(self) -> None:
        super().__init__()
        self.weight, self.counting = nn.Parameter(torch.randn(6, 6)), True
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):
        if self.counting:
            self.calls += 1
        return torch.tanh(x @ self.weight) * (1 + 0.1 * self.calls)


class CountedGRU(nn.GRU):
    """A GRU (replayed one example at a time) whose last output scales with a count of its calls
    kept in a buffer."""

    def __init__(self) -> None:
        super().__init__(6, 6, batch_first=True)
        self.register_buffer("calls", torch.zeros(()))

    def forward(self, x):  # (B, 6) -> (B, 6)
        self.calls += 1
        return super().forward(x.unsqueeze(1).expand(-1, 3, -1))[0][:, -1] * (1 + 0.1 * self.calls)


class SetAnew(nn.Module):
    """A layer without a rule whose forward sets its count anew (``self.n = self.n + 1``), or whose
    parent halves its shift in place after it ran (``by_parent``)."""

    def __init__(self, by_parent: bool = False) -> None:
        super().__init__()
        self.weight, self.by_parent = nn.Parameter(torch.randn(6, 6)), by_parent
        self.register_buffer("n", torch.ones(()))

    def forward(self, x):
        if not self.by_parent:
            self.n = self.n + 1
        return torch.tanh(x @ self.weight + self.n)


class HalvedAfter(nn.Sequential):
    """A Sequential whose forward halves its second layer's buffer in place after the layers."""

    def forward(self, x):
        out = super().forward(x)
        with torch.no_grad():
            self[1].n.mul_(0.5)
        return out


BUFFER_UPDATES = {
    "spectral_norm": lambda: nn.utils.spectral_norm(nn.Linear(6, 6)),  # its pre-hook's u and v
    "counter": CountedTanh,
    "counter_loop": CountedGRU,
    "set_anew": SetAnew,
    "by_parent": lambda: SetAnew(by_parent=True),
}


@pytest.mark.parametrize("check_every", [0, 128])
@pytest.mark.parametrize("layer", list(BUFFER_UPDATES))
@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_replayed_layer_whose_forward_changes_its_buffers_replays_from_the_calls(
    method, layer, check_every
):
    """The per-layer replay copied a layer's buffers after the batch's forward had changed them:
    torch.nn.utils.spectral_norm's pre-hook took one more power iteration (rows 4-14 % off, B = 1
    too) and a counter counted again, silently with ``check_every=0`` (round 18); one example at
    a time, each counted on from the last; a count set anew, or a buffer the parent changed after
    the layer ran, read at its end-of-forward value (rows 4-44 % off; round 19). The replay now
    starts every example from the buffers the call found, as a per-example loop does."""
    torch.manual_seed(0)
    layers = (nn.Linear(4, 6), BUFFER_UPDATES[layer](), nn.Linear(6, 3))
    model = (nn.Sequential(*layers) if layer != "by_parent" else HalvedAfter(*layers)).double()
    psg = make_per_sample(model, F.cross_entropy, method, check_every=check_every)
    generator = torch.Generator().manual_seed(1)
    for batch in (3, 1, 5, 2):
        x = torch.randn(batch, 4, generator=generator, dtype=torch.float64)
        y = torch.randint(0, 3, (batch,), generator=generator)
        found = {n: b.clone() for n, b in model.named_buffers()}
        model.zero_grad(set_to_none=True)
        _, rows = call(psg, x, y)
        got = {n: p.grad for n, p in model.named_parameters()}
        after = {n: b.clone() for n, b in model.named_buffers()}
        want = {n: [] for n in got}
        for i in [*range(batch), None]:  # each example alone, then the batch, from the call's
            model.load_state_dict(found, strict=False)
            model.zero_grad(set_to_none=True)
            part = slice(i, i + 1) if i is not None else slice(None)
            F.cross_entropy(model(x[part]), y[part]).backward()
            for n, p in model.named_parameters():
                want[n].append(p.grad.clone())
        for n, g in got.items():
            torch.testing.assert_close(rows[n], torch.stack(want[n][:-1]), msg=n)
            torch.testing.assert_close(g, want[n][-1], msg=n)
        model.load_state_dict(after, strict=False)  # as one plain forward left them
    assert psg.method in ("hooks", "factored")


def test_a_replayed_layer_that_changes_its_buffers_unseen_by_the_probe_is_refused():
    """A layer that starts counting after the probe of its kind of batch changes its buffer where
    no probe saw it: the replay has no buffers from before the call, and the call is refused
    naming the buffer; ``auto`` then takes the next method, and is right."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), CountedTanh(), nn.Linear(6, 3)).double()
    model[1].counting = False
    hooked, auto = (make_per_sample(model, F.cross_entropy, m) for m in ("hooks", "auto"))
    x, y = torch.randn(4, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    for psg in (hooked, auto):
        call(psg, x, y)
    model[1].counting = True
    with pytest.raises(UnsupportedModelError, match=r"^1 \(CountedTanh\): its buffer calls "):
        call(hooked, x, y)
    found = {n: b.clone() for n, b in model.named_buffers()}
    model.zero_grad(set_to_none=True)
    with pytest.warns(UserWarning):
        _, rows = call(auto, x, y)
    model.load_state_dict(found, strict=False)
    want = {}
    for i in range(4):
        model.load_state_dict(found, strict=False)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        for n, p in model.named_parameters():
            want.setdefault(n, []).append(p.grad.clone())
    for n, g in want.items():
        torch.testing.assert_close(rows[n], torch.stack(g), msg=n)
    assert auto.method not in ("hooks", "factored")


class MomentumHead(nn.Module):
    """Attention (whose ``out_proj`` runs inside it: a silent layer the probe follows), then a
    head plus a tenth of its momentum copy, a frozen Linear moved halfway to the head in place by
    every training forward (as MoCo's key encoder)."""

    def __init__(self) -> None:
        super().__init__()
        self.att, self.head = nn.MultiheadAttention(6, 2, batch_first=True), nn.Linear(6, 3)
        self.ema = nn.Linear(6, 3).requires_grad_(False)

    def forward(self, x):  # (B, T, 6) -> (B, 3)
        h = self.att(x, x, x)[0].mean(1)
        if self.training:
            with torch.no_grad():
                for e, p in zip(self.ema.parameters(), self.head.parameters(), strict=True):
                    e.mul_(0.5).add_(0.5 * p)
        return self.head(h) + 0.1 * self.ema(h)


@pytest.mark.parametrize("method", ["hooks", "factored", "auto"])
def test_a_forward_that_moves_frozen_weights_leaves_the_probe_and_the_check_their_graphs(method):
    """A momentum copy moved in place by every forward: the probe's 3 copies moved it after the
    probe of 2, whose graph the probe then differentiated to follow attention's out_proj, and a
    full check's forwards moved it before the identity's backward through the batch's graph:
    both raised torch's "modified by an inplace operation" (the fuzzer's param:ema with a dropout,
    seeds 121 and 1167, where no other method is left). Each now reads a graph no forward has
    changed since, and the hook path is right."""
    torch.manual_seed(0)
    model = MomentumHead().double()
    psg = make_per_sample(model, F.cross_entropy, method)
    generator = torch.Generator().manual_seed(1)
    for batch in (3, 1, 4, 4):
        x = torch.randn(batch, 2, 6, generator=generator, dtype=torch.float64)
        y = torch.randint(0, 3, (batch,), generator=generator)
        found = {n: t.clone() for n, t in model.state_dict().items()}
        model.zero_grad(set_to_none=True)
        _, rows = call(psg, x, y)
        got = {n: p.grad for n, p in model.named_parameters() if p.requires_grad}
        after = {n: t.clone() for n, t in model.state_dict().items()}
        want = {n: [] for n in got}
        for i in [*range(batch), None]:  # each example alone, then the batch, from the call's
            model.load_state_dict(found)
            model.zero_grad(set_to_none=True)
            part = slice(i, i + 1) if i is not None else slice(None)
            F.cross_entropy(model(x[part]), y[part]).backward()
            for n in got:
                want[n].append(model.get_parameter(n).grad.clone())
        for n, g in got.items():
            torch.testing.assert_close(rows[n], torch.stack(want[n][:-1]), msg=n)
            torch.testing.assert_close(g, want[n][-1], msg=n)
        model.load_state_dict(after)
    assert psg.method in ("hooks", "factored")


def _doubled_in_place(module: nn.Module, args: tuple) -> None:
    args[0].mul_(2)


#: a pre-hook of the user's: new arguments (refused), the same tensor in a new tuple (a device
#: placement's: right), the input changed in place (refused)
PRE_HOOKS = {
    "new": lambda module, args: (2 * args[0] + 1,),
    "same": lambda module, args: (args[0],),
    "in_place": _doubled_in_place,
}


@pytest.mark.parametrize("when", [None, False, True], ids=["before", "after", "prepended"])
@pytest.mark.parametrize("kind", list(PRE_HOOKS))
@pytest.mark.parametrize("method", ["hooks", "factored"])
def test_a_pre_hook_that_changes_a_replayed_layers_input_is_refused(method, kind, when):
    """A forward pre-hook of the user's on a layer without a rule ran again in the per-layer
    replay, on the input it had already changed: rows 76-118 % off, silently with
    ``check_every=0`` (round 19, F2), and one that changed it in place too (40-95 %, round 20,
    F3). The hook path notes the input tensors and their versions as the call enters, keeps its
    own pre-hook the last, and refuses the layer where a pre-hook gave other tensors or changed
    them (registered before or after make_per_sample), or was registered ahead of the entry's
    (``prepend=True``); one that returns the same tensor in a new tuple is right (round 20, F4:
    refused as a change). ``auto`` takes ``func``, which runs the hook once per example."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), CountedTanh(), nn.Linear(6, 3)).double()
    model[1].counting, hook = False, PRE_HOOKS[kind]
    handle = None if when is not None else model[1].register_forward_pre_hook(hook)
    psg = make_per_sample(model, F.cross_entropy, method, check_every=0)
    handle = handle or model[1].register_forward_pre_hook(hook, prepend=bool(when))
    x, y = torch.randn(4, 4, dtype=torch.float64), torch.tensor([0, 1, 2, 0])
    if kind == "same" and not when:
        _, rows = call(psg, x, y)
        torch.testing.assert_close(rows["1.weight"], per_example_loop(model, x, y)["1.weight"])
        return
    with pytest.raises(UnsupportedModelError, match=r"^1 \(CountedTanh\): a forward pre-hook"):
        call(psg, x, y)
    auto = make_per_sample(model, F.cross_entropy, "auto")  # its entry hook ahead again
    _, rows = call(auto, x.clone(), y)
    torch.testing.assert_close(rows["1.weight"], per_example_loop(model, x, y)["1.weight"])
    assert auto.method == ("factored" if kind == "same" else "func")


def _scaled_input(module: nn.Module, args: tuple) -> tuple:
    return (1.7 * args[0] + 0.3,)


class PreHooked(nn.Module):
    """A narrow convolution and a Linear head, each with a forward pre-hook that changes its
    input, registered before ``make_per_sample``."""

    def __init__(self) -> None:
        super().__init__()
        self.conv, self.head = nn.Conv2d(3, 4, 3), nn.Linear(4, 3)
        for layer in (self.conv, self.head):
            layer.register_forward_pre_hook(_scaled_input)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 5, 5) -> (B, 3)
        return self.head(torch.tanh(self.conv(x)).mean((2, 3)))


@pytest.mark.parametrize("method", ["hooks", "factored"])
def test_a_forward_pre_hook_that_changes_the_input_is_followed(method: str) -> None:
    """A rule layer with a pre-hook of the user's took the per-layer replay, which ran the hook
    again on the input the forward had already got (refused: the rows' mean differed by 0.8-1.5);
    the rule reads the input the forward got, so it keeps the layer."""
    torch.manual_seed(0)
    model = PreHooked().double()
    psg = HookedPerSample(model, F.cross_entropy) if method == "hooks" else None
    psg = psg or PerSamplePipeline(model, F.cross_entropy, method="factored").per_sample
    generator = torch.Generator().manual_seed(1)
    for batch in (1, 4, 3, 4):
        x = torch.randn(batch, 3, 5, 5, generator=generator, dtype=torch.float64)
        y = torch.randint(0, 3, (batch,), generator=generator)
        model.zero_grad(set_to_none=True)
        _, rows = call(psg, x, y)
        got = {n: p.grad.clone() for n, p in model.named_parameters()}
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x), y).backward()
        plain = {n: p.grad.clone() for n, p in model.named_parameters()}
        want = per_example_loop(model, x, y)
        for name, grad in plain.items():
            torch.testing.assert_close(rows[name], want[name], rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(got[name], grad, rtol=1e-9, atol=1e-12)


class Routed(nn.Module):
    """Sparse top-1 routing: each example goes through the expert its gate picks (``x[mask]``)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.head = nn.Linear(4, 2), nn.Linear(4, 3)
        self.experts = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 4) -> (B, 3)
        p = self.gate(x).softmax(-1)
        picked, h = p.argmax(-1), torch.zeros_like(x)
        for k, expert in enumerate(self.experts):
            chosen = (picked == k).nonzero(as_tuple=True)[0]
            h = h.index_put((chosen,), expert(x[chosen]) * p[chosen, k : k + 1])
        return self.head(torch.tanh(h))


def test_routing_by_value_is_refused_naming_it_and_auto_is_right() -> None:
    """The probe's copies of one example all take one expert, so the other's input is empty:
    the hook path refuses naming a selection by value and advising func or loop (it advised func
    alone, which vmap cannot run here); ``auto`` ends on loop, right over several batches."""
    torch.manual_seed(0)
    model = Routed().double()
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(4, 4, generator=generator, dtype=torch.float64)
    y = torch.randint(0, 3, (4,), generator=generator)
    with pytest.raises(UnsupportedModelError, match=r"selection by value.*func or loop") as error:
        HookedPerSample(model, F.cross_entropy)(x, y)
    assert "\n" not in str(error.value)
    psg = PerSamplePipeline(model, F.cross_entropy).per_sample
    for batch in (1, 4, 3):
        x = torch.randn(batch, 4, generator=generator, dtype=torch.float64)
        y = torch.randint(0, 3, (batch,), generator=generator)
        model.zero_grad(set_to_none=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # auto announces loop once
            _, rows = call(psg, x, y)
        want = per_example_loop(model, x, y)
        for name, row in rows.items():
            torch.testing.assert_close(row, want[name], rtol=1e-9, atol=1e-12)
    assert psg.method == "loop"


class SparseBag(nn.Module):
    """A sparse ``nn.Embedding``'s mean over the tokens, then a head: ``(B, T)`` ids -> 3."""

    def __init__(self) -> None:
        super().__init__()
        self.emb, self.head = nn.Embedding(20, 5, sparse=True), nn.Linear(5, 3)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.emb(ids).mean(1))


@pytest.mark.parametrize("method", ["hooks", "factored"])
def test_a_sparse_embedding_keeps_its_rule(method: str) -> None:
    """``Embedding(sparse=True)`` took the per-layer replay, which vmap cannot run on a sparse
    gradient (refused with a raw "reshape is not implemented for sparse tensors"); its rows are
    the dense rule's and ``param.grad`` autograd's sparse gradient, right over several batches."""
    torch.manual_seed(0)
    model = SparseBag().double()
    psg = PerSamplePipeline(model, F.cross_entropy, method=method).per_sample
    generator = torch.Generator().manual_seed(1)
    for batch in (1, 4, 3):
        ids = torch.randint(0, 20, (batch, 6), generator=generator)
        y = torch.randint(0, 3, (batch,), generator=generator)
        model.zero_grad(set_to_none=True)
        _, rows = call(psg, ids, y)
        assert model.emb.weight.grad.is_sparse
        got = {n: p.grad.to_dense() for n, p in model.named_parameters()}
        want = per_example_loop(model, ids, y)
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(ids), y).backward()
        for name, p in model.named_parameters():
            torch.testing.assert_close(rows[name], want[name].to_dense(), rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(got[name], p.grad.to_dense(), rtol=1e-9, atol=1e-12)


def _live_tensors() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, torch.Tensor))


@pytest.mark.parametrize("method", ["hooks", "factored", "func"])
def test_calls_leave_no_tensors_behind(method: str) -> None:
    """Over many calls of one psg, the tensors alive stay as many: a cache on ``part_rows``
    (7578e90) kept every call's dense rows, so memory grew by the rows of each step (a
    ResNet-18 with GroupNorm: 24 GB in two benchmark repeats)."""
    torch.manual_seed(0)
    model = LeNet()
    psg = make_per_sample(model, F.cross_entropy, method)
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    for _ in range(3):  # the checks' first calls, kept structures made
        call(psg, x, y)
    before = _live_tensors()
    for _ in range(10):
        model.zero_grad(set_to_none=True)
        call(psg, x, y)
    assert _live_tensors() - before <= 2


def test_the_hook_path_leaves_each_layer_its_own_hooks_and_no_more() -> None:
    """The entry hook of replayed layers was registered on every layer (its handle kept only for
    replayed ones): rule layers ran it on every call (LeNet's step 5 % slower) and kept one more
    after every rebuild (a layer frozen and unfrozen). A rule layer has the path's forward hook
    and pre-hook; a replayed one its entry hook too; a rebuild leaves as many."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 6), CountedTanh(), nn.Linear(6, 3))
    psg = make_per_sample(model, F.cross_entropy, "hooks")
    x, y = torch.randn(4, 4), torch.tensor([0, 1, 2, 0])
    for frozen in (False, True, False):  # each change of what trains rebuilds the layers
        model[0].weight.requires_grad_(not frozen)
        call(psg, x, y)
        assert [len(m._forward_pre_hooks) for m in model] == [1, 2, 1]
        assert [len(m._forward_hooks) for m in model] == [1, 1, 1]


class ConstantInInferenceMode(nn.Module):
    """A constant that a layer computes under ``torch.inference_mode()`` in the forward."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.out = nn.Linear(6, 8), nn.Linear(8, 8), nn.Linear(8, 3)

    def forward(self, x):
        with torch.inference_mode():
            shift = self.b(x.new_ones(1, 8)).clone()  # an inference tensor: no version
        return self.out(torch.relu(self.a(x)) + shift)


class OwnVmap(nn.Module):
    """A Linear mapped over time steps by the model's own ``torch.vmap``."""

    def __init__(self) -> None:
        super().__init__()
        self.step, self.out = nn.Linear(4, 6), nn.Linear(6, 3)

    def forward(self, x):  # (B, T, 4)
        h = torch.vmap(lambda xt: torch.tanh(self.step(xt)), in_dims=1, out_dims=1)(x)
        return self.out(h.mean(1))


class SparseBags(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.bags, self.out = nn.EmbeddingBag(20, 6, mode="sum", sparse=True), nn.Linear(6, 3)

    def forward(self, tokens):
        return self.out(self.bags(tokens))


def example_rows(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> dict:
    """name -> ``(B, *shape)``: each example's gradient alone (zeros where it reaches none;
    sparse gradients densified), on a float64 copy."""
    named = list(model.named_parameters())
    rows = {n: [] for n, _ in named}
    for i in range(len(y)):
        loss = F.cross_entropy(model(x[i : i + 1]), y[i : i + 1])
        grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
        for (n, p), g in zip(named, grads, strict=True):
            g = torch.zeros_like(p) if g is None else g
            rows[n].append(g.to_dense() if g.is_sparse else g)
    return {n: torch.stack(r) for n, r in rows.items()}


CALLS = {  # (model, inputs of B examples, what the hook path says; None: right)
    "inference_mode": (ConstantInInferenceMode, lambda g, b: torch.randn(b, 6, generator=g), None),
    "own_vmap": (
        OwnVmap,
        lambda g, b: torch.randn(b, 5, 4, generator=g),
        r"^step \(Linear\): it runs inside a torch\.func transform of the model's own",
    ),
    "sparse_bags": (
        SparseBags,
        lambda g, b: torch.randint(0, 20, (b, 4), generator=g),
        r"^bags \(EmbeddingBag\) with sparse=True",
    ),
}


@pytest.mark.parametrize("method", ["auto", "hooks", "factored"])
@pytest.mark.parametrize("case", list(CALLS))
def test_layer_calls_the_hook_path_cannot_record_are_right_or_named(method, case) -> None:
    """Adversarial round 41, each on the hook path: a constant a layer computes under
    ``torch.inference_mode()`` relayed "Inference tensors do not track version counter" (that
    call has no gradient: not recorded now); a layer under the model's own ``torch.vmap`` was
    called one that "the loss reaches other than through this layer's forward"; an
    ``EmbeddingBag(sparse=True)`` relayed "reshape is not implemented for sparse tensors" with a
    hint about models that need the whole batch. Right over 4 batches against a float64 loop, or
    refused naming the cause (auto: right, on another method)."""
    build, inputs, refusal = CALLS[case]
    torch.manual_seed(0)
    model = build()
    reference, g = build().double(), torch.Generator().manual_seed(2)
    if refusal is not None and method != "auto":  # at construction, or the first call
        x, y = inputs(g, 3), torch.randint(0, 3, (3,), generator=g)
        with pytest.raises(UnsupportedModelError, match=refusal):
            make_per_sample(model, F.cross_entropy, method=method)(x, y)
        return
    psg = make_per_sample(model, F.cross_entropy, method=method)
    for size in (3, 1, 6, 2):
        x, y = inputs(g, size), torch.randint(0, 3, (size,), generator=g)
        reference.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
        expected = example_rows(reference, x.double() if x.is_floating_point() else x, y)
        _, grads = psg(x, y)
        for name, rows in grads.as_dict().items():
            torch.testing.assert_close(rows.double(), expected[name], rtol=1e-4, atol=1e-5)


class CoordinateBias(nn.Module):
    """An MLP over a ``(1, 5, 5, 2)`` coordinate buffer gives an attention bias that every
    example adds (Swin V2's continuous position bias): two layers in a row without a batch."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("coords", torch.randn(1, 5, 5, 2))
        self.mlp = nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 1, bias=False))
        self.query, self.out = nn.Linear(4, 4), nn.Linear(4, 3)

    def forward(self, x):  # (B, 5, 4)
        bias = self.mlp(self.coords).squeeze(-1)  # (1, 5, 5)
        scores = self.query(x) @ x.transpose(1, 2) + bias  # (B, 5, 5)
        return self.out((scores.softmax(-1) @ x).mean(1))


@pytest.mark.parametrize("method", ["auto", "hooks", "factored"])
def test_layers_in_a_row_without_a_batch_are_expanded_one_after_another(method) -> None:
    """Adversarial round 41: the probe expanded both layers of an MLP over a coordinate buffer
    at once, so the second got the batch twice, and the hook path refused the model as one whose
    "batch is not one dimension of its own" ((2, 2, 5, 5, 8) for two examples). The first layer
    that ran is expanded, then the probe runs again: right over 4 batches (float64 loop)."""
    torch.manual_seed(0)
    model, g = CoordinateBias(), torch.Generator().manual_seed(3)
    reference = CoordinateBias().double()
    psg = make_per_sample(model, F.cross_entropy, method=method)
    for size in (3, 1, 6, 2):
        x, y = torch.randn(size, 5, 4, generator=g), torch.randint(0, 3, (size,), generator=g)
        reference.load_state_dict({k: v.double() for k, v in model.state_dict().items()})
        expected = example_rows(reference, x.double(), y)
        _, grads = psg(x, y)
        assert psg.method != "loop", psg.reason
        for name, rows in grads.as_dict().items():
            torch.testing.assert_close(rows.double(), expected[name], rtol=1e-4, atol=1e-5)
