"""VRGD: GSNR statistics against a per-example loop, exact γ → 1 reductions, clip counters,
setting errors, and the paper's linear-regression toy problem."""

from __future__ import annotations

import io
import math

import pytest
import torch
import torch.nn.functional as F
from support.sync_guard import HostCopyGuard
from torch import nn

from grab_exp.grads import flatten_grads
from grab_exp.optim import VRSGD, VRAdam, VRMomentum, device_step, gsnr_ratios
from grab_exp.per_sample import FuncPerSample

F64 = torch.float64
OPTIMIZERS = [VRSGD, VRMomentum, VRAdam]


class SmallNet(nn.Module):
    """Conv2d + Linear, both with biases: four parameter tensors."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(2, 3, kernel_size=3)  # (B, 2, 5, 5) -> (B, 3, 3, 3)
        self.fc = nn.Linear(27, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).flatten(1))  # (B, 4)


def small_net(seed: int = 0) -> SmallNet:
    torch.manual_seed(seed)
    return SmallNet().to(F64)


def batches(count: int, b: int = 8, seed: int = 1) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(b, 2, 5, 5, generator=g, dtype=F64), torch.randint(0, 4, (b,), generator=g))
        for _ in range(count)
    ]


def brute_force_gsnr(model, x, y, k, gamma, eps):
    """The module's formulas, written out with a per-example loop of ordinary backward()."""
    per_example = []
    for i in range(len(x)):
        model.zero_grad()
        F.cross_entropy(model(x[i : i + 1]), y[i : i + 1]).backward()
        per_example.append([p.grad.detach().clone() for p in model.parameters()])
    m = len(x) // k
    ratios, low, high = [], 0, 0
    for j, _ in enumerate(model.parameters()):
        groups = [sum(per_example[i][j] for i in range(d * m, (d + 1) * m)) / m for d in range(k)]
        mean = sum(groups) / k
        second = sum(g * g for g in groups) / k
        var = (second - mean * mean).clamp(min=0)
        r = mean**2 / (var + eps * second.mean() + torch.finfo(F64).tiny)
        scaled = r / (r.mean() if r.mean() > 0 else 1.0)
        low += int((scaled < gamma).sum())
        high += int((scaled > 1).sum())
        ratios.append(scaled.clamp(gamma, 1.0))
    return ratios, low, high


@pytest.mark.parametrize("k", [8, 4, 2])
def test_gsnr_matches_per_example_loop(k):
    model, (x, y) = small_net(), batches(1)[0]
    expected, low, high = brute_force_gsnr(model, x, y, k, gamma=0.1, eps=1e-8)
    assert low > 0 and high > 0  # both clips are exercised
    _, grads = FuncPerSample(model, F.cross_entropy)(x, y)
    stats = gsnr_ratios(grads, groups=None if k == 8 else k, gamma=0.1, eps=1e-8)
    assert stats.names == tuple(n for n, _ in model.named_parameters())
    for got, want in zip(stats.ratios, expected, strict=True):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)
    assert (int(stats.clip_low), int(stats.clip_high)) == (low, high)
    sizes = [p.numel() for p in model.parameters()]
    matrix = flatten_grads(grads, sum(sizes))  # (B, d)
    flat = gsnr_ratios(matrix, groups=k, sizes=sizes)  # the (B, d) matrix path
    torch.testing.assert_close(flat.flat, stats.flat, rtol=1e-13, atol=1e-15)


def test_gsnr_guards_and_scale_invariance():
    g = torch.Generator().manual_seed(0)
    grads = {
        "w": torch.randn(6, 3, 4, generator=g, dtype=F64),
        "zero": torch.zeros(6, 5, dtype=F64),  # ḡ = σ² = 0: no 0/0
        "same": torch.ones(6, 2, dtype=F64),  # σ² = 0, ḡ ≠ 0: finite
        "empty": torch.zeros(6, 0, dtype=F64),
    }
    stats = gsnr_ratios(grads, gamma=0.2)
    assert all(torch.isfinite(r).all() for r in stats.ratios)
    assert torch.equal(stats.as_dict()["zero"], torch.full((5,), 0.2, dtype=F64))
    assert torch.equal(stats.as_dict()["same"], torch.ones(2, dtype=F64))
    assert stats.as_dict()["empty"].shape == (0,) and stats.numel == 19
    scaled = gsnr_ratios({**grads, "w": grads["w"] * 1e-9}, gamma=0.2)  # ε is relative
    torch.testing.assert_close(scaled.ratios[0], stats.ratios[0], rtol=1e-12, atol=0)


def test_clip_counters_accumulate_and_reset():
    # Tensor a (3 cols): ḡ=1, σ²=0 (huge r) | ḡ=0 | ḡ=1, σ²=1 -> scaled ~3 (high), 0, ~0 (low).
    # Tensor b (2 cols): r = 9 | 0 -> scaled 2 (high), 0 (low). Per step: 3 low, 2 high of 5.
    a = torch.tensor([[1.0, 1, 2], [1, -1, 0], [1, 1, 2], [1, -1, 0]], dtype=F64)  # (B=4, 3)
    b = torch.tensor([[1.0, 0], [2, 0], [1, 0], [2, 0]], dtype=F64)  # (B=4, 2)
    params = [nn.Parameter(torch.zeros(3, dtype=F64)), nn.Parameter(torch.zeros(2, dtype=F64))]
    opt = VRSGD(params, lr=0.1)
    for _ in range(2):
        for p, g in zip(params, (a, b), strict=True):
            p.grad = g.mean(0)
        stats = opt.observe(torch.cat([a, b], dim=1))  # (B, d) matrix, split by parameter
        assert (int(stats.clip_low), int(stats.clip_high)) == (3, 2)
        opt.step()
    assert opt.clip_fractions() == {"gsnr/clip_low": 0.6, "gsnr/clip_high": 0.4}
    after = opt.clip_fractions()  # reset: nothing observed since
    assert math.isnan(after["gsnr/clip_low"]) and math.isnan(after["gsnr/clip_high"])


def _train_pair(vr, reference, steps=5, tol=0.0, device="cpu"):
    """Step a VR optimizer (observe + step) and a torch one on identical copies; both models.
    The first is whether they agreed after every step (bit for bit unless ``tol``: relative,
    and absolute at a thousandth of it)."""
    models = [small_net().to(device), small_net().to(device)]
    opts = [vr(models[0].parameters()), reference(models[1].parameters())]
    engines = [FuncPerSample(m, F.cross_entropy) for m in models]
    start = [p.detach().clone() for p in models[0].parameters()]
    for x, y in batches(steps):
        x, y = x.to(device), y.to(device)
        for i, (opt, psg) in enumerate(zip(opts, engines, strict=True)):
            opt.zero_grad(set_to_none=True)
            _, grads = psg(x, y)
            if i == 0:
                opt.observe(grads)
            opt.step()
        for p, q in zip(models[0].parameters(), models[1].parameters(), strict=True):
            if not torch.allclose(p, q, rtol=tol, atol=tol / 1000):
                return False, start, models
    return True, start, models


REDUCTIONS = [
    (VRSGD, dict(lr=0.3), torch.optim.SGD, dict(lr=0.3)),
    (VRSGD, dict(lr=0.3, weight_decay=0.05), torch.optim.SGD, dict(lr=0.3, weight_decay=0.05)),
    (VRMomentum, dict(lr=0.1, weight_decay=0.01), torch.optim.SGD,
     dict(lr=0.1, momentum=0.9, weight_decay=0.01)),
    (VRMomentum, dict(lr=0.1, momentum=0.8, nesterov=True), torch.optim.SGD,
     dict(lr=0.1, momentum=0.8, nesterov=True, foreach=True)),
    (VRMomentum, dict(lr=0.1, momentum=0.7, dampening=0.3), torch.optim.SGD,
     dict(lr=0.1, momentum=0.7, dampening=0.3, foreach=False)),
]  # fmt: skip
#: VR-Adam keeps its step counts on the device (capturable): torch's capturable Adam, which
#: runs on CUDA alone, is its bit-for-bit reduction; the CPU's Adam agrees to rounding
ADAM_REDUCTIONS = [
    (dict(lr=0.01, weight_decay=0.01), dict(lr=0.01, weight_decay=0.01, foreach=False)),
    (dict(lr=0.01, betas=(0.8, 0.99), adam_eps=1e-6),
     dict(lr=0.01, betas=(0.8, 0.99), eps=1e-6, foreach=True)),
]  # fmt: skip


@pytest.mark.parametrize(("vr", "vr_kw", "ref", "ref_kw"), REDUCTIONS)
def test_gamma_one_is_exactly_the_plain_optimizer(vr, vr_kw, ref, ref_kw):
    same, start, models = _train_pair(
        lambda p: vr(p, gamma=1.0, **vr_kw), lambda p: ref(p, **ref_kw)
    )
    assert same  # torch.equal after every one of the 5 steps
    assert not torch.equal(start[0], next(models[0].parameters()))  # it did train
    same, _, _ = _train_pair(lambda p: vr(p, gamma=0.1, **vr_kw), lambda p: ref(p, **ref_kw))
    assert not same  # and the GSNR does change the steps


@pytest.mark.parametrize(("vr_kw", "ref_kw"), ADAM_REDUCTIONS)
def test_gamma_one_vr_adam_is_adam_to_rounding_on_the_cpu(vr_kw, ref_kw):
    same, start, models = _train_pair(
        lambda p: VRAdam(p, gamma=1.0, **vr_kw),
        lambda p: torch.optim.Adam(p, **ref_kw),
        tol=1e-3,  # float32: 1 - β2^t rounds to 1e-5 relative (torch capturable Adam too)
    )
    assert same
    assert not torch.equal(start[0], next(models[0].parameters()))
    same, _, _ = _train_pair(
        lambda p: VRAdam(p, gamma=0.1, **vr_kw), lambda p: torch.optim.Adam(p, **ref_kw), tol=1e-3
    )
    assert not same


@pytest.mark.gpu
@pytest.mark.parametrize(("vr_kw", "ref_kw"), ADAM_REDUCTIONS)
def test_gamma_one_vr_adam_is_capturable_adam_bit_for_bit(vr_kw, ref_kw):
    ref_kw = {**ref_kw, "foreach": True}  # the multi-tensor path VR-Adam mirrors
    same, _, _ = _train_pair(
        lambda p: VRAdam(p, gamma=1.0, **vr_kw),
        lambda p: torch.optim.Adam(p, capturable=True, **ref_kw),
        device="cuda",
    )
    assert same


@pytest.mark.gpu
def test_a_cpu_mapped_vr_adam_state_counts_on_the_device_again():
    """A checkpoint is loaded with map_location="cpu": the step counts go back to the GPU."""
    param = nn.Parameter(torch.randn(4, device="cuda"))
    opt = VRAdam([param], lr=0.01)
    param.grad = torch.randn(4, device="cuda")
    opt.observe([torch.randn(6, 4, device="cuda")])
    opt.step()
    state = torch.load(_saved(opt.state_dict()), map_location="cpu")
    opt.load_state_dict(state)
    opt.observe([torch.randn(6, 4, device="cuda")])
    opt.step()
    assert opt.state[param]["step"].device.type == "cuda"
    assert opt.state[param]["step"].item() == 2


def _saved(state: dict) -> io.BytesIO:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return buffer


def test_vr_adam_resumes_a_state_with_host_step_counts():
    """A checkpoint written before the step counts moved to the device continues exactly."""
    params = [nn.Parameter(torch.randn(4, dtype=F64)) for _ in range(2)]
    twin = [nn.Parameter(p.detach().clone()) for p in params]
    per_sample = [torch.randn(6, 4, dtype=F64) for _ in range(3)]
    opts = [VRAdam(params, lr=0.01), VRAdam(twin, lr=0.01)]
    for opt, ps in zip(opts, (params, twin), strict=True):
        for p in ps:
            p.grad = per_sample[0].mean(0)
        opt.observe(per_sample[:2])
        opt.step()
    old = opts[1].state_dict()
    for state in old["state"].values():
        state["step"] = int(state["step"])  # as written before
    opts[1].load_state_dict(old)
    for opt, ps in zip(opts, (params, twin), strict=True):
        for p in ps:
            p.grad = per_sample[2].mean(0)
        opt.observe(per_sample[1:])
        opt.step()
    assert all(torch.equal(p, q) for p, q in zip(params, twin, strict=True))


def test_updates_follow_the_formulas_for_general_ratios():
    g = torch.Generator().manual_seed(3)
    theta = torch.randn(5, generator=g, dtype=F64)
    grads = [torch.randn(8, 5, generator=g, dtype=F64) for _ in range(3)]  # 3 steps of (B, 5)
    p_sgd, p_mom, p_adam, p_ref_mom, p_ref_adam = (nn.Parameter(theta.clone()) for _ in range(5))
    sgd = VRSGD([p_sgd], lr=0.1, weight_decay=0.02)
    mom = VRMomentum([p_mom], lr=0.1, momentum=0.9, weight_decay=0.02)
    adam = VRAdam([p_adam], lr=0.01, weight_decay=0.02, beta3=0.9)
    ref_mom = torch.optim.SGD([p_ref_mom], lr=0.1, momentum=0.9, weight_decay=0.02)
    ref_adam = torch.optim.Adam([p_ref_adam], lr=0.01, weight_decay=0.02)
    ema = torch.zeros(5, dtype=F64)
    for t, per_sample in enumerate(grads, start=1):
        r = gsnr_ratios([per_sample]).ratios[0]  # (5,)
        assert (r < 1).any()  # a non-trivial scaling
        ema = 0.9 * ema + 0.1 * r
        expected_sgd = p_sgd.detach() - 0.1 * (r * per_sample.mean(0) + 0.02 * p_sgd.detach())
        for p, opt in ((p_sgd, sgd), (p_mom, mom), (p_adam, adam)):
            p.grad = per_sample.mean(0)
            opt.observe([per_sample])
            opt.step()
        p_ref_mom.grad = r * per_sample.mean(0)  # torch's SGD fed r ⊙ ḡ
        ref_mom.step()
        p_ref_adam.grad = ema / (1 - 0.9**t) * per_sample.mean(0)  # torch's Adam fed p̂ ⊙ ḡ
        ref_adam.step()
        torch.testing.assert_close(p_sgd.detach(), expected_sgd, rtol=1e-14, atol=1e-15)
        assert torch.equal(p_mom, p_ref_mom)
        torch.testing.assert_close(p_adam.detach(), p_ref_adam.detach(), rtol=1e-12, atol=1e-14)


BAD_SETTINGS = [
    ("gamma", dict(gamma=0.0)),
    ("gamma", dict(gamma=1.5)),
    ("gamma", dict(gamma=-0.1)),
    ("groups", dict(groups=1)),
    ("groups", dict(groups=0)),
    ("groups", dict(groups=2.5)),
    ("eps", dict(eps=0.0)),
    ("eps", dict(eps=-1e-8)),
    ("lr", dict(lr=0.0)),
    ("lr", dict(lr=-0.1)),
]


@pytest.mark.parametrize("cls", OPTIMIZERS)
@pytest.mark.parametrize(("setting", "kwargs"), BAD_SETTINGS)
def test_bad_settings_raise_one_line_errors(cls, setting, kwargs):
    with pytest.raises(ValueError, match=rf"^optimizer\.{setting}: got") as error:
        cls([nn.Parameter(torch.zeros(2))], **{"lr": 0.1, **kwargs})
    assert "\n" not in str(error.value)


def test_bad_batches_and_missing_gsnr():
    p = nn.Parameter(torch.zeros(4))
    with pytest.raises(ValueError, match=r"^optimizer\.groups: got 3; a batch of 8") as error:
        VRSGD([p], lr=0.1, groups=3).observe([torch.randn(8, 4)])
    assert "\n" not in str(error.value)
    with pytest.raises(ValueError, match=r"^optimizer\.groups: got null"):
        VRSGD([p], lr=0.1).observe([torch.randn(1, 4)])  # one example: one group
    VRSGD([p], lr=0.1, groups=16).check_batches(256, 50000)  # last batch 80 = 16 * 5
    with pytest.raises(ValueError, match=r"^optimizer\.groups: got null.*last batch\)$"):
        VRSGD([p], lr=0.1).check_batches(16, 49)  # last batch of 1 example
    with pytest.raises(ValueError, match=r"^optimizer\.groups: got 32; a batch of 16"):
        VRSGD([p], lr=0.1, groups=32).check_batches(16, 48)
    with pytest.raises(ValueError, match="parameter order"):
        VRSGD([p], lr=0.1).observe([torch.randn(8, 5)])
    p.grad = torch.ones(4)
    with pytest.raises(RuntimeError, match="observe"):
        VRSGD([p], lr=0.1).step()


def test_frozen_parameters_are_skipped():
    model, (x, y) = small_net(), batches(1)[0]
    model.conv.bias.requires_grad_(False)
    frozen = model.conv.bias.detach().clone()
    opt = VRMomentum(model.parameters(), lr=0.1)
    psg = FuncPerSample(model, F.cross_entropy)
    _, grads = psg(x, y)  # three trainable tensors, in parameter order
    opt.observe(grads)
    opt.step()
    assert torch.equal(model.conv.bias, frozen)


@pytest.mark.parametrize("cls", OPTIMIZERS)
def test_observe_and_step_copy_no_host_tensor_to_the_device(cls):
    """On ``meta`` (a device without data), as the CPU can show what sync-debug mode refuses:
    the first step's state (VR-Adam's step count) and every later step stay on the device."""
    p = torch.zeros(4, device="meta", requires_grad=True)
    opt = cls([p], lr=0.01, groups=4)
    with HostCopyGuard():
        for _ in range(2):
            opt.observe([torch.randn(8, 4, device="meta")])
            p.grad = torch.zeros(4, device="meta")
            opt.step()
    if cls is VRAdam:
        assert opt.state[p]["step"].device.type == "meta"


def test_a_loaded_host_step_count_becomes_a_device_fill():
    p = torch.zeros(4, device="meta")
    with HostCopyGuard():
        for count in (3, torch.tensor(3.0)):  # an older checkpoint's int, a CPU-mapped tensor
            step = device_step(count, p)
            assert step.device.type == "meta" and step.dtype == torch.float32
    assert device_step(torch.tensor(3.0), torch.zeros(2)).item() == 3.0


@pytest.mark.gpu
@pytest.mark.parametrize("cls", OPTIMIZERS)
def test_observe_and_step_are_sync_free_on_cuda(cls):
    model = small_net().float().cuda()
    opt = cls(model.parameters(), lr=0.01, groups=4)
    psg = FuncPerSample(model, F.cross_entropy)
    data = [(x.float().cuda(), y.cuda()) for x, y in batches(3)]
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for x, y in data:
            opt.zero_grad(set_to_none=True)
            _, grads = psg(x, y)
            opt.observe(grads)
            opt.step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    fractions = opt.clip_fractions()
    assert 0 < fractions["gsnr/clip_low"] < 1 and 0 <= fractions["gsnr/clip_high"] < 1


def _toy_losses(optimizer_cls, lr, seed, steps=100):
    """Linear regression y = x·W + w0 + noise (W_i = i, w0 = 0, noise std 1), batch 2048."""
    true_w = torch.arange(1, 11, dtype=F64)  # (10,)
    model = nn.Linear(10, 1).to(F64)
    nn.init.zeros_(model.weight)
    nn.init.zeros_(model.bias)

    def loss_fn(out, y):
        return F.mse_loss(out.squeeze(-1), y)

    psg = FuncPerSample(model, loss_fn)
    opt = optimizer_cls(model.parameters(), lr=lr)
    g = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(steps):
        x = torch.randn(2048, 10, generator=g, dtype=F64)  # (B, 10)
        y = x @ true_w + torch.randn(2048, generator=g, dtype=F64)  # (B,)
        opt.zero_grad(set_to_none=True)
        _, grads = psg(x, y)
        if isinstance(opt, VRSGD):
            opt.observe(grads)
        opt.step()
        with torch.no_grad():  # expected test MSE on fresh x ~ N(0, I): ‖w − W‖² + w0² + 1
            error = (model.weight[0] - true_w).square().sum() + model.bias[0].square()
        losses.append(float(error) + 1.0)
    return losses


@pytest.mark.slow
def test_toy_problem_vr_sgd_reaches_sgds_100_step_loss_within_60_steps():
    """The paper's toy claim, on curves averaged over 4 data seeds (one run is plateau noise).

    lr = 0.1 for both, tuned once on a scan (0.03-0.5). Caveat, measured: at lr = 0.1 SGD's own
    mean curve is already at its 100-step loss by step 33 (both plateau at a noise-driven level;
    VR-SGD gets there at ~42 with a slightly lower plateau), and at SGD's best 100-step lr (0.05)
    VR-SGD needs ~77 steps. VR-SGD's steps are never larger than SGD's (r <= 1).
    """
    lr, seeds = 0.1, range(4)
    sgd = [_toy_losses(torch.optim.SGD, lr, s) for s in seeds]
    vr = [_toy_losses(VRSGD, lr, s) for s in seeds]
    sgd_mean = [sum(run[t] for run in sgd) / len(sgd) for t in range(100)]  # over the seeds
    vr_mean = [sum(run[t] for run in vr) / len(vr) for t in range(100)]
    reached = next((t + 1 for t in range(100) if vr_mean[t] <= sgd_mean[-1]), None)
    assert reached is not None and reached <= 60, f"VR-SGD reached it at step {reached}"
