"""GraBSampler: a torch Sampler over a balance, its batch view, step checks and resume."""

from __future__ import annotations

import io

import pytest
import torch
from support.helpers import current_order, make, random_grads, run_epochs
from torch.utils.data import DataLoader, TensorDataset

from grab_exp.sampler import GraBSampler, parameters_device

N, D, B = 30, 4, 4
F64 = {"dtype": torch.float64, "seed": 2}


def test_iter_len_and_a_sanity_pass():
    sampler = GraBSampler(N, D, balance="mean", **F64)
    first = list(sampler)
    assert all(isinstance(i, int) for i in first)
    assert len(sampler) == N and sorted(first) == list(range(N))
    assert list(sampler) == first  # iterating twice in one epoch: same order
    assert first == current_order(make("mean", N, D, **F64))


def test_dataloader_epochs_match_the_balance():
    """A DataLoader over the sampler, with a sanity pass before each epoch, steps with the
    batch's indices and reaches the same orders as the bare balance."""
    zs = random_grads(N, D, 3, seed=1)
    want = run_epochs(make("pair", N, D, **F64), zs, B)
    dataset = TensorDataset(torch.arange(N))
    sampler = GraBSampler(dataset, D, balance="pair", **F64)
    loader = DataLoader(dataset, batch_size=B, sampler=sampler)
    for epoch, z in enumerate(zs):
        seen = [idx for (idx,) in loader]  # sanity pass, no steps
        for (idx,) in loader:
            sampler.step(z[idx], indices=idx)
        assert torch.cat(seen).tolist() == want[epoch]
        sampler.set_epoch(epoch + 1)
        assert sampler.epoch == epoch + 1
        assert list(sampler) == want[epoch + 1]


@pytest.mark.parametrize(
    ("batch_size", "drop_last"), [(4, False), (4, True), (5, True), (1, False)]
)
def test_index_batches_cover_the_order(batch_size, drop_last):
    sampler = GraBSampler(N, D, balance="recursive", depth=2, **F64)
    batches = list(sampler.index_batches(batch_size, drop_last=drop_last))
    assert all(isinstance(x, torch.Tensor) and x.dtype == torch.long for x in batches)
    keep = N - N % batch_size if drop_last else N
    assert torch.cat(batches).tolist() == list(sampler)[:keep]
    assert all(len(x) == batch_size for x in batches[:-1])
    assert len(batches) == (N // batch_size if drop_last else -(-N // batch_size))


def test_step_checks_the_indices():
    z = random_grads(N, D, 1)[0]
    sampler = GraBSampler(N, D, balance="batch", **F64)
    batches = list(sampler.index_batches(B))
    with pytest.raises(ValueError):
        sampler.step(z[batches[1]], indices=batches[1])  # skips the first batch
    with pytest.raises(ValueError):
        sampler.step(z[batches[0]][:3], indices=batches[0])  # wrong row count
    sampler.step(z[batches[0]], indices=batches[0])
    with pytest.raises(ValueError):
        sampler.step(z[batches[0]], indices=batches[0])  # already stepped


def test_balance_instance_and_parameters():
    bal = make("recursive_pair", N, D, batch_size=8, **F64)
    sampler = GraBSampler(N, balance=bal)
    assert list(sampler) == current_order(bal)
    with pytest.raises(ValueError, match=r"\bn\b"):
        GraBSampler(N + 1, balance=bal)
    model = torch.nn.Linear(3, 2)
    assert GraBSampler(N, model.parameters(), balance="mean").d == 8
    for name in ("rr", "so", "fixed"):
        assert sorted(GraBSampler(N, balance=name)) == list(range(N))


def test_per_sample_gradients_from_vmap():
    """End to end: the dict that torch.func.vmap(grad(...)) returns, stepped batch by batch."""
    from torch.func import functional_call, grad, vmap

    model = torch.nn.Linear(3, 1).double()
    params = {k: v.detach() for k, v in model.named_parameters()}
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(N, 3, generator=g, dtype=torch.float64), torch.randn(N, generator=g)

    def loss(p, xi, yi):
        return (functional_call(model, p, (xi[None],)).squeeze() - yi) ** 2

    per_sample = vmap(grad(loss), in_dims=(None, 0, 0))
    flat = torch.cat([t.reshape(N, -1) for t in per_sample(params, x, y).values()], 1)
    sampler = GraBSampler(N, model.parameters(), balance="mean", **F64)
    for idx in sampler.index_batches(B):
        sampler.step(per_sample(params, x[idx], y[idx]), indices=idx)
    sampler.set_epoch(1)
    assert list(sampler) == run_epochs(make("mean", N, 4, **F64), [flat], B)[-1]


def test_sampler_resume_mid_epoch():
    zs = random_grads(N, D, 3, seed=8)
    kw = {"balance": "recursive", "depth": 2, "kernel": "probabilistic", "seed": 4}
    straight = run_epochs(GraBSampler(N, D, **kw), zs, B)
    sampler = GraBSampler(N, D, **kw)
    for idx in list(sampler.index_batches(B))[:3]:
        sampler.step(zs[0][idx])
    buf = io.BytesIO()
    torch.save(sampler.state_dict(), buf)
    fresh = GraBSampler(N, D, **kw)
    fresh.load_state_dict(torch.load(io.BytesIO(buf.getvalue())))
    rest = torch.tensor(list(fresh))  # iterating a resumed sampler yields the rest of the epoch
    assert len(rest) == N - 12
    assert torch.equal(rest, fresh.visit_order[12:])
    for s in range(0, len(rest), B):
        fresh.step(zs[0][rest[s : s + B]], indices=rest[s : s + B])
    fresh.set_epoch(1)
    assert run_epochs(fresh, zs[1:], B) == straight[1:]


def test_a_dataloader_over_a_resumed_sampler_continues_the_epoch_bit_for_bit():
    """The README's loop, killed mid-epoch and resumed from the sampler's state: the same
    batches and the same next order as the run that was not interrupted."""
    zs = random_grads(N, D, 2, seed=9)
    dataset = TensorDataset(torch.arange(N))

    def run(stop_after: int | None, state=None):
        sampler = GraBSampler(dataset, D, balance="pair", **F64)
        if state is not None:
            sampler.load_state_dict(state)
        seen = []
        for step, (idx,) in enumerate(DataLoader(dataset, batch_size=B, sampler=sampler)):
            if step == stop_after:
                return seen, sampler.state_dict()
            sampler.step(zs[0][idx], indices=idx)
            seen.append(idx)
        sampler.set_epoch(1)
        return seen, list(sampler)

    straight, next_order = run(None)
    first, state = run(3)
    rest, resumed_next = run(None, state)
    assert torch.equal(torch.cat(first + rest), torch.cat(straight))
    assert resumed_next == next_order


def test_default_device_follows_the_parameters():
    on_meta = torch.nn.Linear(3, 2, device="meta")  # where a CUDA model's parameters would be
    assert parameters_device(on_meta.parameters()) == torch.device("meta")
    frozen = torch.nn.Linear(3, 2, device="meta").requires_grad_(False)
    assert parameters_device([*frozen.parameters(), *torch.nn.Linear(2, 1).parameters()]) == (
        torch.device("cpu")
    )  # the first trainable one
    assert parameters_device(frozen.parameters()) is None
    model = torch.nn.Linear(3, 2)
    sampler = GraBSampler(N, model.parameters(), balance="mean")  # a generator: read once
    assert sampler.device == torch.device("cpu") and sampler.d == 8
    with pytest.raises(RuntimeError, match=r"(?i)meta"):  # the meta device, not the CPU default
        GraBSampler(N, on_meta.parameters(), balance="mean")
    on_cpu = GraBSampler(N, on_meta.parameters(), balance="mean", device="cpu")  # explicit wins
    assert on_cpu.device == torch.device("cpu") and on_cpu.d == 8


def test_a_dataloader_with_workers_visits_the_sampler_order():
    """Worker processes load the batches; the sampler is iterated in the main process, so the
    batches still come in its order and step it."""
    zs = random_grads(N, D, 1, seed=3)
    dataset = TensorDataset(torch.arange(N))
    sampler = GraBSampler(dataset, D, balance="mean", **F64)
    want = list(sampler)
    loader = DataLoader(dataset, batch_size=B, sampler=sampler, num_workers=2)
    seen = []
    for (idx,) in loader:
        sampler.step(zs[0][idx], indices=idx)
        seen += idx.tolist()
    assert seen == want and sampler.pos == N
