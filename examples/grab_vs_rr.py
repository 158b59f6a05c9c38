"""The three-line GraB loop of the README, run twice on the same seed: GraB and random
reshuffling. The examples in this folder call :func:`compare` with their model and data."""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from grab_exp import GraBSampler
from grab_exp.per_sample import make_per_sample


def arguments(
    description: str, epochs: int, examples: int, **floats: tuple[float, str]
) -> argparse.Namespace:
    """``--epochs``, ``--examples`` (training examples used), ``--balance``, ``--batch-size``,
    ``--seed``, and one ``--NAME`` per keyword ``NAME=(default, help)`` (a float)."""
    parser = argparse.ArgumentParser(description=description)
    for name, (default, text) in floats.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=default, help=text)
    parser.add_argument("--epochs", type=int, default=epochs, help="epochs of each ordering")
    parser.add_argument("--examples", type=int, default=examples, help="training examples used")
    parser.add_argument("--balance", default="mean", help="the GraB ordering (mean, pair, ...)")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per step")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the orders")
    args = parser.parse_args()
    if args.epochs < 1 or args.examples < args.batch_size:
        parser.error("--epochs must be >= 1 and --examples >= --batch-size")
    return args


def train(
    make_model: Callable[[], nn.Module],
    train_set: Dataset,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    balance: str,
    args: argparse.Namespace,
    lr: float = 0.01,
) -> list[float]:
    """Train a fresh ``make_model()`` with SGD over the ``balance`` order; the mean train loss
    of each epoch."""
    torch.manual_seed(args.seed)
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    psg = make_per_sample(model, loss_fn)  # method="auto": checked on the first batch
    sampler = GraBSampler(train_set, model.parameters(), balance=balance, seed=args.seed)  # 1
    loader = DataLoader(train_set, batch_size=args.batch_size, sampler=sampler)
    losses = []
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)  # 2
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss, grads = psg(x, y)  # also adds the batch's mean gradient to p.grad
            sampler.step(grads)  # 3
            optimizer.step()
            total += loss.item() * len(x)
        losses.append(total / len(train_set))
    print(f"{balance}: per-sample gradients by method {psg.method!r}")
    return losses


def compare(make_model, train_set, loss_fn, args, lr: float = 0.01) -> None:
    """Print the train loss per epoch of GraB (``args.balance``) beside random reshuffling."""
    grab = train(make_model, train_set, loss_fn, args.balance, args, lr)
    rr = train(make_model, train_set, loss_fn, "rr", args, lr)
    print(f"epoch  {args.balance:>8}  {'rr':>8}  (train loss, seed {args.seed})")
    for epoch, (a, b) in enumerate(zip(grab, rr, strict=True), start=1):
        print(f"{epoch:5d}  {a:8.4f}  {b:8.4f}")
