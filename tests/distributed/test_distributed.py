"""Distributed orderings: 2 real gloo processes on CPU, the simulator, a plain reference."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support import REPO_ROOT, TESTS_DIR
from support.distributed_worker import BATCH, CONFIGS, SEED, D, N, build_ordering, feed, fixed_grads
from support.grab_run import compose_config, run_job_here

from grab_exp.distributed import BlockProjection, SimulatedComm, split_shards

WORLD = 2
HUNG_TIMEOUT_S = 10


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def launch(args: list[str], tmp: Path, world: int = WORLD) -> list[subprocess.Popen]:
    """Start ``world`` ranks of ``python <args>`` with torchrun's environment variables."""
    env = {
        **os.environ,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(free_port()),
        "WORLD_SIZE": str(world),
        "OMP_NUM_THREADS": "1",
    }
    procs = []
    for rank in range(world):
        env_r = {**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}
        out, err = open(tmp / f"out{rank}.txt", "w"), open(tmp / f"err{rank}.txt", "w")  # noqa: SIM115
        procs.append(
            subprocess.Popen(
                [sys.executable, *args], cwd=REPO_ROOT, env=env_r, stdout=out, stderr=err
            )
        )
    return procs


def stderr_of(tmp: Path, rank: int) -> str:
    return (tmp / f"err{rank}.txt").read_text()[-3000:]


def wait_for(ready, procs: list[subprocess.Popen], tmp: Path, timeout: float = 90) -> None:
    """Poll ``ready()`` while every rank is alive."""
    deadline = time.monotonic() + timeout
    while not ready():
        for rank, proc in enumerate(procs):
            assert proc.poll() is None, (
                f"rank {rank} exited {proc.returncode}:\n{stderr_of(tmp, rank)}"
            )
        assert time.monotonic() < deadline, stderr_of(tmp, 0)
        time.sleep(0.2)


def trained_an_epoch(run_dir: Path):
    metrics = run_dir / "metrics.csv"
    return lambda: metrics.exists() and metrics.read_text().count("\n") >= 2


def stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def gloo_job(tmp_path_factory):
    """2 real gloo ranks of ``support/distributed_worker.py``: their saved results, then still
    training."""
    tmp = tmp_path_factory.mktemp("gloo")
    procs = launch([str(TESTS_DIR / "support" / "distributed_worker.py"), str(tmp)], tmp)
    try:
        wait_for(lambda: all((tmp / f"rank{r}.pt").exists() for r in range(WORLD)), procs, tmp)
        ranks = [torch.load(tmp / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
        yield {"ranks": ranks, "procs": procs, "tmp": tmp}
    finally:
        stop(procs)


@pytest.fixture(scope="module")
def ranks(gloo_job) -> list[dict]:
    """What each real rank saw (see support/distributed_worker.py)."""
    return gloo_job["ranks"]


@pytest.fixture(scope="module")
def simulated() -> dict:
    """The same orderings and gradients on 2 simulated workers in this process."""
    comm, split = SimulatedComm(WORLD), split_shards(N, WORLD, SEED)
    return {
        key: feed(
            build_ordering(name, split.shards, D, comm, seed=SEED, **options),
            fixed_grads(),
        )
        for key, (name, options) in CONFIGS.items()
    }


@pytest.mark.parametrize("key", CONFIGS)
def test_orders_are_permutations_of_each_shard(ranks, key):
    for rank, result in enumerate(ranks):
        shard = sorted(result["shards"][rank].tolist())
        for order in result[key]["orders"]:
            assert order.shape == (1, N // WORLD)
            assert sorted(order[0].tolist()) == shard
    assert ranks[0]["dropped"].numel() == N % WORLD


@pytest.mark.parametrize("key", [k for k in CONFIGS if k.startswith("cd_grab")])
def test_ranks_agree_on_balancing_state(ranks, key):
    first, second = ranks[0][key], ranks[1][key]
    for acc0, acc1 in zip(first["acc"], second["acc"], strict=True):
        assert acc0.abs().sum() > 0
        assert torch.equal(acc0, acc1)  # bitwise
    for gen0, gen1 in zip(first["generator"], second["generator"], strict=True):
        assert torch.equal(gen0, gen1)


@pytest.mark.parametrize("key", CONFIGS)
def test_orders_equal_the_simulator(ranks, simulated, key):
    for rank, result in enumerate(ranks):
        pairs = zip(result[key]["orders"], simulated[key]["orders"], strict=True)
        for epoch, (real, sim) in enumerate(pairs):
            assert torch.equal(real[0], sim[rank]), f"{key} rank {rank} epoch {epoch}"
        assert result[key]["bytes"] == simulated[key]["bytes"]
    if key.startswith("cd_grab"):
        for real, sim in zip(ranks[0][key]["acc"], simulated[key]["acc"], strict=True):
            assert torch.equal(real, sim)


def test_coordination_changes_the_orders(simulated):
    """cd_grab and d_grab start alike but must not stay alike (the ranks interact)."""
    cd, d = simulated["cd_grab"]["orders"], simulated["d_grab"]["orders"]
    assert torch.equal(cd[0], d[0])
    assert any(not torch.equal(a, b) for a, b in zip(cd[1:], d[1:], strict=True))


def test_bytes_sent_per_step(simulated):
    pairs = BATCH // 2
    first_epoch = simulated["cd_grab"]["bytes"][0]  # 21 rows: steps of 6, 6, 6, 3 rows
    assert first_epoch == (3 * pairs + 1) * D * 8  # float64, d values per pair
    assert simulated["cd_grab_prob_proj"]["bytes"][0] == (3 * pairs + 1) * 3 * 4  # k=3, float32


def test_models_stay_identical_across_ranks(ranks):
    sums0, sums1 = ranks[0]["checksums"], ranks[1]["checksums"]
    assert len(sums0) == 3
    for a, b in zip(sums0, sums1, strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(sums0[0], sums0[-1])  # the model did train


def lost_rank_error(procs, tmp: Path, how: int, timeout_s: float) -> tuple[int, float, str]:
    """Once rank 0 has trained an epoch, kill or stop rank 1; rank 0's exit, delay, stderr."""
    try:
        wait_for(trained_an_epoch(tmp / "run"), procs, tmp)
        os.kill(procs[1].pid, how)
        lost = time.monotonic()
        code = procs[0].wait(timeout=timeout_s + 30)
        return code, time.monotonic() - lost, stderr_of(tmp, 0)
    finally:
        stop(procs)


def test_dead_rank_ends_the_other_with_a_clear_error(gloo_job):
    """A killed peer closes its sockets: the survivor stops at its next collective."""
    code, elapsed, err = lost_rank_error(gloo_job["procs"], gloo_job["tmp"], signal.SIGKILL, 15)
    assert code == 1, err
    assert "error: rank 0/2: collective" in err and "another rank probably died" in err, err
    assert elapsed < 15 + 10, elapsed


def test_hung_rank_ends_the_other_within_the_timeout(tmp_path):
    """A stopped (hung) peer is only noticed by the collective timeout."""
    args = [
        "-m",
        "grab_exp",
        *("experiment=smoke", "model=logreg", "balance=cd_grab", "distributed=true"),
        *("dataset.num_train=64", "dataset.num_test=8", "epochs=100000", "batch_size=8"),
        *("device=cpu", "distributed.backend=gloo", "progress=none"),
        f"distributed.timeout_s={HUNG_TIMEOUT_S}",
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    procs = launch(args, tmp_path)
    code, elapsed, err = lost_rank_error(procs, tmp_path, signal.SIGSTOP, HUNG_TIMEOUT_S)
    assert code == 1, err
    assert f"failed (timeout {HUNG_TIMEOUT_S} s)" in err and "another rank probably" in err, err
    assert HUNG_TIMEOUT_S - 1 < elapsed < HUNG_TIMEOUT_S + 15, elapsed


# --- single-process checks ------------------------------------------------------------------


def reference_cd_grab(orders: list[list[int]], z: torch.Tensor, batch_size: int):
    """CD-GraB as specified, one pair at a time: returns every worker's next order."""
    workers, m = len(orders), len(orders[0])
    acc = torch.zeros(z.shape[1], dtype=torch.float64)
    positives, negatives = [[] for _ in orders], [[] for _ in orders]
    for start in range(0, m, batch_size):
        batches = [order[start : start + batch_size] for order in orders]
        for j in range(len(batches[0]) // 2):  # first pairs of ranks 0..W-1, then second ...
            for r in range(workers):
                first, second = batches[r][2 * j], batches[r][2 * j + 1]
                v = z[first] - z[second]
                s = 1 if float(v @ acc) < 0 else -1
                acc = acc + s * v
                positives[r].append(first if s > 0 else second)
                negatives[r].append(second if s > 0 else first)
        if len(batches[0]) % 2:  # the unpaired last example joins the positives
            for r in range(workers):
                positives[r].append(batches[r][-1])
    return [positives[r] + negatives[r][::-1] for r in range(workers)]


@pytest.mark.parametrize(
    ("workers", "n", "batch_size"), [(3, 45, 4), (4, 30, 2), (2, 41, 8), (1, 9, 4)]
)
def test_simulator_matches_per_example_reference(workers, n, batch_size):
    g = torch.Generator().manual_seed(workers)
    split = split_shards(n, workers, seed=3)
    ordering = build_ordering(
        "cd_grab", split.shards, 5, SimulatedComm(workers), seed=3, dtype="float64"
    )
    expected = ordering.orders.tolist()
    for epoch in range(3):
        z = torch.randn(n, 5, generator=g, dtype=torch.float64)
        assert ordering.orders.tolist() == expected, f"epoch {epoch}"
        for batch in ordering.index_batches(batch_size):
            ordering.step(z[batch.reshape(-1)])
        ordering.set_epoch(epoch + 1)
        expected = reference_cd_grab(expected, z, batch_size)
    assert ordering.orders.tolist() == expected


def test_split_counts_dropped_examples():
    split = split_shards(10, 3, seed=0)
    assert split.shards.shape == (3, 3) and split.num_dropped == 1
    everything = torch.cat([split.shards.flatten(), split.dropped]).sort().values
    assert torch.equal(everything, torch.arange(10))
    assert torch.equal(split_shards(10, 3, seed=0).shards, split.shards)


def test_odd_batch_size_is_rejected_mid_epoch():
    ordering = build_ordering("cd_grab", torch.arange(20).reshape(2, 10), 3, SimulatedComm(2))
    with pytest.raises(ValueError, match="even"):
        ordering.step(torch.zeros(2 * 3, 3))


def test_projection_is_blockwise_seeded_and_unbiased():
    a = BlockProjection(10, 4, seed=5, block_rows=3, dtype=torch.float64)
    b = BlockProjection(10, 4, seed=5, block_rows=3, dtype=torch.float64)
    v = torch.randn(7, 10, dtype=torch.float64)
    assert torch.equal(a(v), b(v))
    assert torch.allclose(a(v), v @ a.dense())
    assert set(a.dense().abs().unique().tolist()) == {0.5}
    big = BlockProjection(50, 4000, seed=1, block_rows=16, dtype=torch.float64)
    x, y = torch.randn(2, 50, dtype=torch.float64)
    assert abs(float(big(x[None]) @ big(y[None]).T) - float(x @ y)) < 0.15 * float(
        x.norm() * y.norm()
    )


# --- the Hydra job (simulated workers, in this process) -------------------------------------


def _hydra_job(run_dir: Path, epochs: int) -> dict:
    overrides = [
        "experiment=smoke",
        "model=logreg",
        "balance=cd_grab",
        "dataset.num_train=67",
        "dataset.num_test=16",
        "batch_size=4",
        f"epochs={epochs}",
        "progress=none",
        "distributed.simulate_workers=3",
        "balance.projection_dim=16",
    ]
    return run_job_here(overrides, run_dir)


def test_hydra_job_simulates_workers_and_resumes_exactly(tmp_path):
    from grab_exp.logging.local import LocalStore
    from grab_exp.runner.rundir.checkpoint import load_checkpoint

    straight = _hydra_job(tmp_path / "straight", epochs=3)
    _hydra_job(tmp_path / "resumed", epochs=2)
    LocalStore(tmp_path / "resumed", ()).write_summary("running")  # as if killed after epoch 2
    resumed = _hydra_job(tmp_path / "resumed", epochs=3)
    assert resumed["train/loss"] == straight["train/loss"]  # the ordering state came back
    summary = LocalStore(tmp_path / "resumed", ()).read_summary()
    assert summary["world_size"] == 3 and summary["dropped_examples"] == 1
    assert summary["status"] == "finished"
    assert len(load_checkpoint(tmp_path / "resumed")["ordering"]) == 1  # one process
    assert straight["comm/bytes_per_step"] > 0


def test_slurm_launcher_composes_a_torchrun_style_job():
    """2 nodes x 4 tasks (one process per GPU): submitit starts every task, each a rank."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    overrides = [
        "hydra/launcher=slurm",
        "hydra.launcher.nodes=2",
        "hydra.launcher.tasks_per_node=4",
        "hydra.launcher.gpus_per_node=4",
        "distributed=true",
        "distributed.workers=8",
        "balance=cd_grab",
        "balance.projection_dim=256",
    ]
    cfg = compose_config(overrides, hydra=True)
    launcher = cfg.hydra.launcher
    assert launcher._target_.endswith("SlurmLauncher")
    assert (launcher.nodes, launcher.tasks_per_node, launcher.gpus_per_node) == (2, 4, 4)
    options = cfg.distributed
    assert options.enabled and options.workers == 8 and options.simulate_workers == 0


def test_slurm_task_variables_become_torchrun_variables(monkeypatch):
    pytest.importorskip("submitit")
    from grab_exp.distributed.join import export_slurm_env

    slurm = {
        "SLURM_JOB_ID": "42",
        "SLURM_PROCID": "5",
        "SLURM_NTASKS": "8",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "1",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu[07-08]",
        "SUBMITIT_EXECUTOR": "slurm",
    }
    for key, value in slurm.items():
        monkeypatch.setenv(key, value)
    for key in (
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_WORLD_SIZE",
    ):
        monkeypatch.setenv(key, "")  # restored (or removed) after the test ...
        monkeypatch.delenv(key)  # ... and absent during it
    assert export_slurm_env()
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == (
        "5",
        "8",
        "1",
    )
    assert os.environ["MASTER_ADDR"] == "gpu07"
    assert not export_slurm_env()  # RANK is set now (torchrun's own variables win)


def test_distributed_true_shorthand_composes_with_its_keys_and_bad_options_are_refused():
    from hydra.errors import ConfigCompositionException

    from grab_exp.runner.config.check import ConfigError, validate_config

    cfg = compose_config(["distributed=true", "distributed.workers=8", "distributed.timeout_s=30"])
    assert cfg.distributed.enabled and cfg.distributed.workers == 8
    assert cfg.distributed.timeout_s == 30
    assert not compose_config([]).distributed.enabled
    bad = compose_config(["distributed.simulate_workers=-1", "balance=cd_grab"])
    with pytest.raises(ConfigError, match=r"distributed\.simulate_workers: got -1"):
        validate_config(bad)
    with pytest.raises(ConfigCompositionException, match="workerz"):
        compose_config(["distributed.workerz=2"])  # Hydra itself: not in the schema


def test_a_cd_grab_state_from_before_the_one_ordering_base_is_refused_in_one_line():
    """cd_grab's state gained n, d and its projection (its sketch now has its own random
    stream, so an older sketched state could not continue); the checkpoint says so."""
    from grab_exp.runner.config.schema import ConfigError
    from grab_exp.runner.training.strategy import restore_ordering

    ordering = build_ordering("cd_grab", torch.arange(20).reshape(2, 10), 3, SimulatedComm(2))
    state = ordering.state_dict()
    old = {k: v for k, v in state.items() if k not in ("n", "d", "projection", "ranks")}
    old["lanes"] = state["ranks"]
    with pytest.raises(ConfigError, match=r"^checkpoint.pt: state_dict: has no 'n' .*start") as e:
        restore_ordering(ordering, old)
    assert "\n" not in str(e.value)
    restore_ordering(ordering, state)  # today's state loads


@pytest.mark.parametrize("name", ["d_rr", "d_grab", "cd_grab"])
def test_a_mid_epoch_state_of_a_data_parallel_ordering_resumes_exactly(name):
    split, comm = split_shards(40, 2, seed=1), SimulatedComm(2)
    z = torch.randn(40, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    options = {} if name == "d_rr" else {"dtype": "float64"}

    def feed(ordering, batches):
        for batch in batches:
            flat = batch.reshape(-1)  # (L * B,) worker-major, as the runner passes them
            ordering.step(z[flat] if ordering.needs_grads else None, flat)

    straight = build_ordering(name, split.shards, 3, comm, seed=1, **options)
    batches = list(straight.index_batches(4))  # 5 per epoch
    feed(straight, batches[:2])
    state = straight.state_dict()
    resumed = build_ordering(name, split.shards, 3, comm, seed=1, **options)
    resumed.load_state_dict(state)
    assert resumed.pos == straight.pos == 8  # 2 batches of 4 per worker
    for ordering in (straight, resumed):
        feed(ordering, batches[2:])
        ordering.set_epoch(1)
    assert torch.equal(resumed.orders, straight.orders)


def test_a_cd_grab_state_of_other_workers_is_refused_before_anything_changes():
    ordering = build_ordering("cd_grab", torch.arange(20).reshape(2, 10), 3, SimulatedComm(2))
    order = ordering.order.clone()
    state = {**ordering.state_dict(), "ranks": [1], "order": order.flip(1)}
    with pytest.raises(ValueError, match=r"state_dict: ranks is \[1\], this ordering has \[0, 1\]"):
        ordering.load_state_dict(state)
    assert torch.equal(ordering.order, order)


def test_a_process_group_overrides_every_collective_of_the_simulator():
    """``Communicator`` is the in-process simulator itself: a process group that left it a
    collective would gather only its own rank's tensors. ``all_reduce_mean_`` is built from
    ``all_reduce_sum_`` and the process count, so both share it."""
    from grab_exp.distributed.comm import Communicator, ProcessGroupComm

    methods = {n for n, v in vars(Communicator).items() if callable(v) and not n.startswith("_")}
    assert methods - set(vars(ProcessGroupComm)) == {"all_reduce_mean_"}
