"""``balance.projection_dim``: seeded block projections of the per-sample gradients.

The projection equals its dense matrix, never holds more than one block, and wires into every
gradient-based variant exactly (the projected variant orders like the plain variant run on
``v R``); herding survives a k = 256 sketch of LeNet's 62,006-value gradients.
"""

from __future__ import annotations

import io

import pytest
import torch
from support.grab_run import compose_config
from support.helpers import BALANCES, GRADIENT_FREE, make, random_grads, run_epochs
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile

from grab_exp.balance.projection import KINDS, PROJECTION_SEED_OFFSET, BlockProjection
from grab_exp.distributed import CoordinatedGraB, SimulatedComm, split_shards
from grab_exp.models import LeNet
from grab_exp.per_sample import PerSamplePipeline
from grab_exp.runner.config.check import ConfigError, validate_config
from grab_exp.sampler import GraBSampler

EXACT_KINDS = ("rademacher", "countsketch")  # entries ±1/4 (k = 16) or ±1: exact on integers


def integer_vectors(rows: int, d: int, seed: int) -> torch.Tensor:
    """``(rows, d)`` float64 small integers: every projection of them is exact."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(-4, 5, (rows, d), generator=g).double()


def largest_allocation(fn) -> int:
    """Bytes of the largest single CPU allocation any op makes while ``fn()`` runs."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    return max(e.self_cpu_memory_usage for e in prof.events())


# --- the projection itself ----------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("kind", KINDS)
def test_projection_matches_its_dense_matrix(kind, dtype):
    p = BlockProjection(1000, 16, seed=3, block_rows=97, kind=kind, dtype=dtype)
    v = integer_vectors(7, 1000, seed=1).to(dtype)
    dense = p.dense()  # (d, k)
    assert dense.shape == (1000, 16) and dense.dtype == dtype
    if kind == "gaussian":  # the block sums are rounded in another order than one GEMM
        torch.testing.assert_close(p(v), v @ dense, rtol=1e-5, atol=1e-4)
    else:
        assert torch.equal(p(v), v @ dense)
    parts = list(v.split([10, 490, 1, 499], dim=1))  # blocks inside and across the parts
    assert torch.equal(p(parts), p(v))
    for seed in (3, 4):  # the same seed, the same R; another seed, another R
        again = BlockProjection(1000, 16, seed=seed, block_rows=97, kind=kind, dtype=dtype)
        assert torch.equal(again(v), p(v)) == (seed == 3)


def test_entries_have_the_documented_distribution():
    rademacher = BlockProjection(4000, 64, seed=0, block_rows=300).dense()
    assert set(rademacher.unique().tolist()) == {-0.125, 0.125}
    assert abs((rademacher > 0).double().mean().item() - 0.5) < 0.01
    # 32 signs come from one draw: neighbours must still be uncorrelated
    signs = rademacher.flatten().sign()
    assert abs((signs[1:] * signs[:-1]).mean().item()) < 0.01
    sketch = BlockProjection(4000, 64, seed=0, block_rows=300, kind="countsketch").dense()
    assert torch.equal(sketch.abs().sum(1), torch.ones(4000))  # one ±1 per row
    assert sketch.abs().sum(0).min() > 20 and sketch.sum().abs() < 200  # spread, both signs
    gaussian = BlockProjection(4000, 64, seed=0, block_rows=300, kind="gaussian").dense()
    assert abs(gaussian.std().item() * 8 - 1) < 0.01


@pytest.mark.parametrize("kind", KINDS)
def test_no_d_by_k_matrix_is_ever_allocated(kind):
    d, k, rows = 8192, 64, 64
    block_bytes, dense_bytes = rows * k * 4, d * k * 4  # 16 KiB vs 2 MiB
    p = BlockProjection(d, k, block_rows=rows, kind=kind)
    v = torch.randn(8, d)
    assert largest_allocation(lambda: p(v)) <= block_bytes < dense_bytes // 100
    bal = make("mean", 64, d, projection_dim=k, projection_block_rows=rows, projection_kind=kind)
    grads = torch.randn(8, d)
    assert largest_allocation(lambda: bal.step(grads)) <= block_bytes
    parts = dict(zip("abc", torch.randn(8, d).split([1000, 7000, 192], dim=1), strict=True))
    assert largest_allocation(lambda: bal.step(parts)) <= block_bytes  # no (B, d) concatenation


# --- wiring into the variants ---------------------------------------------------------------


@pytest.mark.parametrize("kind", EXACT_KINDS)
@pytest.mark.parametrize("name", BALANCES)
def test_projected_variant_equals_plain_variant_on_projected_vectors(name, kind):
    n, d, k, b = 40, 300, 16, 4
    options = {"batch_size": b, "depth": 2, "kernel": "probabilistic", "c": 5.0, "seed": 11}
    zs = [integer_vectors(n, d, seed=e) for e in range(3)]
    sketched = make(
        name, n, d, projection_dim=k, projection_kind=kind, projection_block_rows=64,
        dtype="float64", **options,
    )  # fmt: skip
    dense = sketched.projection.dense()  # (d, k)
    plain = make(name, n, k, dtype="float64", **options)
    assert run_epochs(sketched, zs, b) == run_epochs(plain, [z @ dense for z in zs], b)
    for key in plain.state_tensors:
        assert torch.equal(getattr(sketched, key), getattr(plain, key)), key


@pytest.mark.parametrize("name", BALANCES)
def test_state_is_allocated_with_k_values_per_vector(name):
    n, d, k = 64, 5000, 32
    plain, sketched = (make(name, n, d, depth=5, projection_dim=p) for p in (None, k))
    vectors = {"mean": 3, "batch": 3, "pair": 2, "recursive": 63 + 2, "recursive_pair": 3}[name]
    assert plain.state_bytes() - sketched.state_bytes() == vectors * (d - k) * 4
    assert all(getattr(sketched, key).shape[-1] == k for key in sketched.state_tensors)


@pytest.mark.parametrize("name", BALANCES)
def test_same_seed_same_orders_and_the_seed_picks_the_projection(name):
    n, d, b = 48, 200, 8
    zs = random_grads(n, d, 3, seed=5)
    runs = [
        run_epochs(make(name, n, d, batch_size=b, seed=s, projection_dim=8), zs, b)
        for s in (0, 0, 1)
    ]
    assert runs[0] == runs[1]
    one, other = (make(name, n, d, batch_size=b, seed=s, projection_dim=8) for s in (0, 1))
    assert not torch.equal(one.projection.dense(), other.projection.dense())


@pytest.mark.parametrize("name", BALANCES)
def test_mid_epoch_resume_with_projection_is_bit_identical(name):
    n, d, b, save = 40, 120, 4, 20
    zs = random_grads(n, d, 3, seed=7)

    def build():
        return make(name, n, d, batch_size=b, depth=3, kernel="probabilistic", c=3.0, seed=7,
                    projection_dim=12, projection_block_rows=50)  # fmt: skip

    reference = run_epochs(build(), zs, b)
    bal = build()
    run_epochs(bal, zs[:1], b)
    order = bal.order.clone()
    for s in range(0, save, b):
        bal.step(zs[1][order[s : s + b]])
    blob = io.BytesIO()
    torch.save(bal.state_dict(), blob)
    resumed = build()
    resumed.load_state_dict(torch.load(io.BytesIO(blob.getvalue())))
    for s in range(save, n, b):
        resumed.step(zs[1][order[s : s + b]])
    resumed.set_epoch(2)
    assert run_epochs(resumed, zs[2:], b) == reference[2:]
    for other in (dict(projection_dim=13), dict(projection_kind="gaussian"), dict(seed=8)):
        options = {"batch_size": b, "depth": 3, "seed": 7, "projection_dim": 12, **other}
        stranger = make(name, n, d, projection_block_rows=50, **options)
        with pytest.raises(ValueError, match="state_dict: projection"):
            stranger.load_state_dict(torch.load(io.BytesIO(blob.getvalue())))


# --- options ------------------------------------------------------------------------------


def sketched(name: str, seed: int, **options):
    """A sketching ordering over 8 examples (per worker for cd_grab) with d = 10, k = 4."""
    options = {"projection_dim": 4, "projection_block_rows": 3, "seed": seed, **options}
    if name == "cd_grab":
        return CoordinatedGraB(split_shards(16, 2, seed).shards, 10, SimulatedComm(2), **options)
    return make(name, 8, 10, **options)


@pytest.mark.parametrize("name", ["mean", "pair", "recursive", "cd_grab"])
def test_sketch_and_kernel_draws_are_independent_streams(name):
    """``R`` comes from its own seeded stream, built in one place for every ordering: the
    kernel's draws do not move it, and it does not move them (cd_grab once drew both from one
    stream)."""
    plain = sketched(name, 5)
    assert plain.projection.seed == (5 + PROJECTION_SEED_OFFSET) % 2**63
    assert plain.generator.initial_seed() == 5 != plain.projection.seed
    probabilistic = sketched(name, 5, kernel="probabilistic", c=0.5)
    probabilistic._thresholds(7)  # the kernel draws; R was fixed before and stays
    assert torch.equal(probabilistic.projection.dense(), plain.projection.dense())
    other_sketch = sketched(name, 5, kernel="probabilistic", c=0.5, projection_kind="gaussian")
    assert not torch.equal(other_sketch.projection.dense(), plain.projection.dense())
    fresh = sketched(name, 5, kernel="probabilistic", c=0.5)
    assert torch.equal(other_sketch._thresholds(7), fresh._thresholds(7))


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"projection_dim": 100}, r"balance.projection_dim: got 100 with d=100 .*< d$"),
        ({"projection_dim": 0}, r"balance.projection_dim: got 0 .*allowed: null or an integer"),
        ({"projection_dim": 2.5}, r"balance.projection_dim: got 2.5"),
        ({"projection_dim": True}, r"balance.projection_dim: got True"),
        ({"projection_dim": 8, "projection_kind": "sparse"}, r"projection_kind: got 'sparse'"),
        ({"projection_dim": 8, "projection_block_rows": 0}, r"projection_block_rows: got 0"),
    ],
)
def test_bad_projection_options_fail_before_any_work(options, message):
    n = 10**12  # a first order this long would take hours and terabytes: the check is first
    with pytest.raises(ValueError, match=message) as info:
        make("recursive", n, 100, **options)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("name", GRADIENT_FREE)
def test_gradient_free_orderings_have_no_projection(name):
    assert make(name, 10, 100).projection is None


def test_sampler_passes_the_projection_options_through():
    model = LeNet()
    sampler = GraBSampler(64, model.parameters(), balance="recursive", projection_dim=32)
    assert (sampler.d, sampler.dim) == (62_006, 32)
    grads = {name: torch.randn(16, *p.shape) for name, p in model.named_parameters()}
    sampler.step(grads)  # the dict vmap(grad) returns
    assert sampler.acc.shape == (63, 32)
    with pytest.raises(ValueError, match=r"balance\.projection_dim: rr takes no projection_dim"):
        GraBSampler(64, balance="rr", projection_dim=32)


def test_runner_checks_projection_dim_against_the_models_d():
    tiny = ["dataset=synthetic", "balance=recursive", "epochs=1"]  # LeNet: d = 62,006
    validate_config(compose_config([*tiny, "balance.projection_dim=256"]))
    with pytest.raises(ConfigError, match=r"balance\.projection_dim: got 62006 with d=62006"):
        validate_config(compose_config([*tiny, "balance.projection_dim=62006"]))


# --- herding survives the sketch --------------------------------------------------------------


def lenet_gradients(n: int) -> torch.Tensor:
    """``(n, 62006)`` real per-sample gradients of a seeded LeNet on random CIFAR-shaped data."""
    g = torch.Generator().manual_seed(0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LeNet()
    x, y = torch.randn(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)
    _, grads = PerSamplePipeline(model, F.cross_entropy)(x, y)
    return grads.dense().matrix


def discrepancy(gram: torch.Tensor, order: torch.Tensor) -> float:
    """``max_t |sum_{i <= t} c_order(i)|`` in the original space, from the ``(n, n)`` Gram
    matrix of the centered vectors: ``|prefix_t|^2`` is the sum of its ``t x t`` block."""
    squares = gram[order][:, order].cumsum(0).cumsum(1).diagonal()  # (n,)
    return squares.clamp_min(0).sqrt().max().item()


def test_herding_advantage_over_rr_survives_k_256_sketches():
    n, b, k, epochs = 512, 64, 256, 3
    z = lenet_gradients(n)  # (n, d)
    centered = z - z.mean(0)
    gram = centered @ centered.T  # (n, n)
    g = torch.Generator().manual_seed(1)
    rr = torch.tensor([discrepancy(gram, torch.randperm(n, generator=g)) for _ in range(50)])
    cases = [("mean", "rademacher"), ("mean", "countsketch"), ("recursive", "rademacher")]
    for name, kind in cases:
        plain = run_epochs(make(name, n, z.shape[1]), [z] * epochs, b)[-1]
        sketched = make(name, n, z.shape[1], projection_dim=k, projection_kind=kind)
        ordered = run_epochs(sketched, [z] * epochs, b)[-1]
        plain_disc = discrepancy(gram, torch.tensor(plain))
        sketched_disc = discrepancy(gram, torch.tensor(ordered))
        assert sketched_disc <= 2 * plain_disc, (name, kind, sketched_disc, plain_disc)
        assert sketched_disc < rr.median().item() / 1.5, (name, kind, sketched_disc, rr.median())
