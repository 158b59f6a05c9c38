"""``python -m grab_exp.distributed``: data-parallel training with a distributed ordering.

Real workers (one process per worker, env:// rendezvous)::

    torchrun --nproc_per_node=2 -m grab_exp.distributed --balance cd_grab --epochs 3

Simulated workers (one process)::

    python -m grab_exp.distributed --simulate-workers 8 --balance cd_grab --epochs 3
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import torch.distributed as dist
from torch.nn import functional as F

from grab_exp.distributed.comm import (
    DEFAULT_TIMEOUT_S,
    CollectiveError,
    SimulatedComm,
    exit_after_collective_error,
    init_distributed,
)
from grab_exp.distributed.orderings import make_distributed_ordering
from grab_exp.distributed.shards import split_shards
from grab_exp.distributed.train import (
    METRIC_COLUMNS,
    DataParallelJob,
    check_identical_models,
    run_epoch,
)
from grab_exp.logging.local import LocalStore
from grab_exp.runner.pipeline import ClassicPipeline, FunctionalPipeline

MODELS = ("logreg", "mlp", "lenet")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line (see ``--help``)."""
    p = argparse.ArgumentParser(
        prog="python -m grab_exp.distributed",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--balance", default="cd_grab", choices=("cd_grab", "d_grab", "d_rr"))
    p.add_argument("--kernel", default="deterministic", choices=("deterministic", "probabilistic"))
    p.add_argument("--c", type=float, default=30.0, help="probabilistic kernel scale")
    p.add_argument("--normalize", action="store_true", help="unit-norm pair differences")
    p.add_argument("--projection-dim", type=int, default=None, help="cd_grab: send k values/pair")
    p.add_argument("--dtype", default="float32", choices=("float32", "float64"))
    p.add_argument("--simulate-workers", type=int, default=0, help="W virtual workers, 1 process")
    p.add_argument("--dataset", default="synthetic", choices=("synthetic", "cifar10_jpeg"))
    p.add_argument("--archive", default="../shared/data/cifar10-jpeg.tar.gz")
    p.add_argument("--num-train", type=int, default=2048, help="synthetic training examples")
    p.add_argument("--num-test", type=int, default=512, help="synthetic test examples")
    p.add_argument("--subset", type=int, default=None, help="cifar10_jpeg training subset")
    p.add_argument("--test-subset", type=int, default=None, help="cifar10_jpeg test subset")
    p.add_argument("--model", default="logreg", choices=MODELS)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=16, help="examples per worker per step")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--momentum", type=float, default=0.9)
    p.add_argument("--weight-decay", type=float, default=0.0)
    p.add_argument("--method", default="func", choices=("func", "hooks", "auto"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="auto", help="simulator device: auto | cpu | cuda[:k]")
    p.add_argument("--backend", default="auto", choices=("auto", "gloo", "nccl"))
    p.add_argument("--timeout-s", type=float, default=DEFAULT_TIMEOUT_S)
    p.add_argument("--out", default=None, help="run directory (rank 0 writes metrics.csv)")
    return p.parse_args(argv)


def _connect(args: argparse.Namespace):
    if args.simulate_workers:
        device = args.device
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        return SimulatedComm(args.simulate_workers), torch.device(device)
    return init_distributed(args.backend, args.timeout_s)


def _load_data(args: argparse.Namespace):
    if args.dataset == "synthetic":
        from grab_exp.data import make_synthetic

        return make_synthetic(num_train=args.num_train, num_test=args.num_test)
    from grab_exp.data import load_cifar10_jpeg

    return load_cifar10_jpeg(args.archive, subset=args.subset, test_subset=args.test_subset)


def _model(name: str) -> torch.nn.Module:
    from grab_exp.models import MLP, LeNet, LogReg

    return {"logreg": LogReg, "mlp": MLP, "lenet": LeNet}[name]()


def build_job(args: argparse.Namespace, comm, device: torch.device) -> tuple[DataParallelJob, int]:
    """The process's job and the number of dropped examples."""
    data = _load_data(args).to(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(args.seed)
        model = _model(args.model).to(device)
    d = sum(p.numel() for p in model.parameters() if p.requires_grad)
    split = split_shards(len(data.train_y), comm.world_size, args.seed)
    options = {
        "kernel": args.kernel,
        "c": args.c,
        "normalize": args.normalize,
        "projection_dim": args.projection_dim,
        "dtype": args.dtype,
    }
    ordering = make_distributed_ordering(
        args.balance, split.shards, d, comm, seed=args.seed, device=device, **options
    )
    pipeline_cls = FunctionalPipeline if ordering.needs_grads else ClassicPipeline
    extra = {"method": args.method} if ordering.needs_grads else {}
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=args.momentum, weight_decay=args.weight_decay
    )
    job = DataParallelJob(
        model,
        optimizer,
        ordering,
        pipeline_cls(model, F.cross_entropy, **extra),
        data,
        args.batch_size,
        comm,
    )
    return job, split.num_dropped


def train(args: argparse.Namespace, comm, device: torch.device) -> list[dict]:
    """Train ``args.epochs`` epochs; rank 0 prints and writes the metrics."""
    job, dropped = build_job(args, comm, device)
    writer = comm.rank == 0
    store = LocalStore(Path(args.out), METRIC_COLUMNS) if writer and args.out else None
    if writer:
        print(
            f"workers={comm.world_size} shard={job.ordering.m} dropped={dropped} "
            f"balance={args.balance}",
            flush=True,
        )
    if store:
        store.write_summary(
            "running",
            world_size=comm.world_size,
            dropped_examples=dropped,
            balance=args.balance,
            simulated=bool(args.simulate_workers),
        )
    check_identical_models(job.model, comm)
    rows = []
    for epoch in range(args.epochs):
        rows.append(run_epoch(job, epoch))
        if writer:
            print(" ".join(f"{k}={v:.6g}" for k, v in rows[-1].items()), flush=True)
        if store:
            store.append(rows[-1])
    if store:
        store.write_summary("finished", final=rows[-1] if rows else {})
    return rows


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns 0, or ends the process with status 1 when a collective failed."""
    args = parse_args(argv)
    comm, device = _connect(args)
    try:
        train(args, comm, device)
    except CollectiveError as error:
        exit_after_collective_error(error)
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0
