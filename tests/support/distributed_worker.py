"""One rank of the 2-process gloo checks in ``tests/distributed/test_distributed.py`` (a script).

Started once per rank with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, ...).
It feeds fixed seeded gradients to every distributed ordering, runs a short data-parallel
training, and saves what it saw to ``<out>/rank<r>.pt`` for the test to compare; then it
trains on through ``python -m grab_exp distributed=true``'s entry point until a test kills a
rank.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: the support package
N, D, BATCH, EPOCHS, SEED = 43, 6, 6, 3, 7  # 43 = 2 * 21 + 1: one dropped, odd last batch
TIMEOUT_S = 15  # of the process group: rendezvous and every collective
CONFIGS = {
    "cd_grab": ("cd_grab", {"dtype": "float64"}),
    "cd_grab_prob_proj": (
        "cd_grab",
        {"kernel": "probabilistic", "c": 2.0, "projection_dim": 3, "projection_block_rows": 4},
    ),
    "cd_grab_normalize": ("cd_grab", {"normalize": True}),
    "d_grab": ("d_grab", {"dtype": "float64"}),
    "d_rr": ("d_rr", {}),
}


def fixed_grads(epochs: int = EPOCHS) -> list[torch.Tensor]:
    """Per-epoch ``(N, D)`` float64 gradients, a function of the seed only."""
    g = torch.Generator().manual_seed(1234)
    return [torch.randn(N, D, generator=g, dtype=torch.float64) + 0.5 for _ in range(epochs)]


def feed(ordering, grads: list[torch.Tensor], batch_size: int = BATCH) -> dict:
    """Step every epoch's gradients through ``ordering``; record orders and state.

    Returns:
        ``orders``: ``EPOCHS + 1`` tensors ``(L, m)`` (global indices per local worker);
        ``acc``/``generator``: cd_grab's accumulator and generator state at each epoch end.
    """
    record = {"orders": [], "acc": [], "generator": [], "bytes": []}
    for epoch, z in enumerate(grads):
        ordering.set_epoch(epoch)
        record["orders"].append(ordering.orders.clone())
        for batch in ordering.index_batches(batch_size):  # (L, B)
            ordering.step(z[batch.reshape(-1)])
        if hasattr(ordering, "acc"):
            record["acc"].append(ordering.acc.clone())
            record["generator"].append(ordering.generator.get_state())
        record["bytes"].append(ordering.bytes_sent)
    ordering.set_epoch(len(grads))
    record["orders"].append(ordering.orders.clone())
    return record


def build_ordering(name: str, shards: torch.Tensor, d: int, comm, **options):
    """The data-parallel ordering ``name`` (``d_rr``, ``d_grab``, ``cd_grab``)."""
    from grab_exp.balance import Ordering

    return Ordering.choices(distributed=True)[name](shards, d, comm, **options)


def run_orderings(comm) -> dict:
    """Every configuration of ``CONFIGS`` fed with :func:`fixed_grads`."""
    from grab_exp.distributed import split_shards

    split = split_shards(N, comm.world_size, SEED)
    results = {"shards": split.shards, "dropped": split.dropped}
    for key, (name, options) in CONFIGS.items():
        ordering = build_ordering(name, split.shards, D, comm, seed=SEED, **options)
        results[key] = feed(ordering, fixed_grads())
    return results


#: a small cd_grab job on synthetic data (logistic regression, sketched pair differences)
TRAINING = [
    "experiment=smoke",
    "model=logreg",
    "balance=cd_grab",
    "pipeline.method=func",
    "dataset.num_train=66",
    "dataset.num_test=16",
    "batch_size=4",
    "optimizer.lr=0.05",
    "balance.projection_dim=8",
    "distributed.enabled=true",
    "progress=none",
    "device=cpu",
]


def run_training(comm, device) -> list[torch.Tensor]:
    """Two epochs of the runner's data-parallel job; the parameter checksum after each."""
    from hydra.utils import instantiate

    from grab_exp.distributed.sync import parameter_checksum
    from grab_exp.runner.training.build import build_job
    from grab_exp.runner.training.data_parallel import DataParallel
    from grab_exp.runner.training.epoch import run_epoch
    from grab_exp.runner.training.progress import Progress
    from support.grab_run import compose_config

    cfg = compose_config(TRAINING)
    strategy = DataParallel(comm, device, simulated=False)
    job = build_job(cfg, instantiate(cfg.dataset).to(device), strategy)
    sums = [parameter_checksum(job.parts.model)]
    for epoch in range(2):
        run_epoch(job, epoch, Progress("none"))
        sums.append(parameter_checksum(job.parts.model))
    return sums


def train_forever(out: str) -> None:
    """The runner's data-parallel job (``distributed=true``) in this rank, until a test kills a
    rank; the process group is the one :func:`main` joined."""
    from support.grab_run import run_job_here

    run = [
        "experiment=smoke",
        "model=logreg",
        "balance=cd_grab",
        "dataset.num_train=64",
        "dataset.num_test=8",
        "batch_size=8",
        "epochs=100000",
        f"distributed.timeout_s={TIMEOUT_S}",
        "distributed=true",
        "device=cpu",
        "progress=none",
    ]
    run_job_here(run, Path(out) / "run")


def main(out: str) -> int:
    """Save the checks' results, then train "forever" (until the test kills a rank)."""
    from grab_exp.distributed import init_distributed

    comm, device = init_distributed("gloo", timeout_s=TIMEOUT_S)
    results = run_orderings(comm)
    results["checksums"] = run_training(comm, device)
    path = Path(out) / f"rank{comm.rank}.pt"
    torch.save(results, path.with_suffix(".tmp"))
    path.with_suffix(".tmp").replace(path)  # the test sees whole files only
    train_forever(out)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
