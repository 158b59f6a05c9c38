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
    description: str, epochs: int, examples: int, images: bool = False, **floats: tuple[float, str]
) -> argparse.Namespace:
    """``--epochs``, ``--examples`` (training examples used), ``--balance``, ``--batch-size``,
    ``--seed``, one ``--NAME`` per keyword ``NAME=(default, help)`` (a float), and with
    ``images`` where CIFAR-10 comes from (:func:`cifar10`: ``--archive``, ``--synthetic``)."""
    epilog = "CIFAR-10 is downloaded on first use; offline: --archive PATH or --synthetic"
    parser = argparse.ArgumentParser(description=description, epilog=epilog if images else None)
    for name, (default, text) in floats.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=float, default=default, help=text)
    parser.add_argument("--epochs", type=int, default=epochs, help="epochs of each ordering")
    parser.add_argument("--examples", type=int, default=examples, help="training examples used")
    parser.add_argument("--balance", default="mean", help="the GraB ordering (mean, pair, ...)")
    parser.add_argument("--batch-size", type=int, default=16, help="examples per step")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model and the orders")
    if images:
        parser.add_argument(
            "--archive", help="offline: a CIFAR-10 JPEG archive instead of torchvision's download"
        )
        parser.add_argument(
            "--synthetic", action="store_true", help="offline: synthetic 32x32 images, 10 classes"
        )
    args = parser.parse_args()
    if args.epochs < 1 or args.examples < args.batch_size:
        parser.error("--epochs must be >= 1 and --examples >= --batch-size")
    return args


def cifar10(args: argparse.Namespace) -> Dataset:
    """``args.examples`` training images of CIFAR-10 (torchvision's download, ``--archive``'s
    JPEG copy, or ``--synthetic`` images); offline without either, one line and exit 2."""
    from torch.utils.data import TensorDataset

    from grab_exp.data import load_cifar10, load_cifar10_jpeg, make_synthetic

    if args.synthetic:
        data = make_synthetic(num_train=args.examples, num_test=16, seed=args.seed)
    elif args.archive:
        data = load_cifar10_jpeg(args.archive, subset=args.examples)
    else:
        try:
            data = load_cifar10(subset=args.examples)
        except RuntimeError as error:
            cause = str(error).split(";")[0]
            offline = "offline: rerun with --archive PATH or --synthetic"
            raise SystemExit(f"error: {cause}; {offline}") from None
    return TensorDataset(data.train_x, data.train_y)


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
