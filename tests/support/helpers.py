"""Shared helpers for the ordering tests: build a balance, feed it gradients, read its orders."""

from __future__ import annotations

import warnings

import torch
from hydra.utils import get_class
from omegaconf import OmegaConf

from support import REPO_ROOT

CONF_BALANCE = REPO_ROOT / "conf" / "balance"


def single_process_orderings(reads_gradients: bool) -> list[str]:
    """The single-process orderings of ``conf/balance/`` (not the data-parallel ones) whose
    class reads gradients (``needs_grads``) or, with ``False``, those that do not."""
    names = []
    for path in sorted(CONF_BALANCE.glob("*.yaml")):
        cls = get_class(OmegaConf.load(path)._target_)
        if not cls.distributed and cls.needs_grads == reads_gradients:
            names.append(path.stem)
    return names


BALANCES = single_process_orderings(reads_gradients=True)
GRADIENT_FREE = single_process_orderings(reads_gradients=False)
ALL_ORDERINGS = GRADIENT_FREE + BALANCES
KERNELS = ["deterministic", "probabilistic"]


def make(name: str, n: int, d: int, *, batch_size: int = 4, depth: int | None = None, **kw):
    """make_ordering; passes ``batch_size`` only to recursive_pair, ``depth`` only to recursive,
    the gradient options (kernel, c, normalize, dtype, projection_*) only to an ordering that
    reads gradients (the others take none: ``tests/balance/test_validation.py``)."""
    from grab_exp.balance import GradientOrdering, Ordering, make_ordering

    if not Ordering.choices()[name].needs_grads:
        gradient_options = GradientOrdering.options() - Ordering.options()
        kw = {k: v for k, v in kw.items() if k not in gradient_options}
    if name == "recursive_pair":
        kw["batch_size"] = batch_size
    if name == "recursive" and depth is not None:
        kw["depth"] = depth
    return make_ordering(name, n, d, **kw)


def random_grads(n: int, d: int, epochs: int, seed: int = 0) -> list[torch.Tensor]:
    """Per-epoch float64 gradient matrices: a shared offset (so centering matters) plus noise
    that changes every epoch (so the stale mean of the previous epoch matters)."""
    g = torch.Generator().manual_seed(seed)
    offset = 1.5 * torch.randn(d, generator=g, dtype=torch.float64)
    base = torch.randn(n, d, generator=g, dtype=torch.float64)
    return [
        offset + base + 0.5 * torch.randn(n, d, generator=g, dtype=torch.float64)
        for _ in range(epochs)
    ]


def current_order(bal) -> list[int]:
    return [int(i) for i in bal.order.detach().cpu().tolist()]


def step_epoch(bal, z: torch.Tensor, batch_size: int, steps: int | None = None) -> None:
    """Step the first ``steps`` (default: all) examples of the current order, in
    mini-batches of ``batch_size`` (the last one possibly shorter), passing z[batch]."""
    order = bal.order.detach().cpu()
    k = len(order) if steps is None else steps
    for start in range(0, k, batch_size):
        idx = order[start : min(start + batch_size, k)]
        bal.step(z[idx].to(device=bal.order.device))


def run_epochs(bal, zs, batch_size: int, *, steps: int | None = None) -> list[list[int]]:
    """Orders of epochs e0..e0+len(zs); a full epoch must not warn."""
    orders = [current_order(bal)]
    for z in zs:
        step_epoch(bal, z, batch_size, steps)
        with warnings.catch_warnings():
            if steps is None:
                warnings.simplefilter("error", UserWarning)
            else:
                warnings.simplefilter("ignore", UserWarning)
            bal.set_epoch(bal.epoch + 1)
        orders.append(current_order(bal))
    return orders


def is_permutation(order, n: int) -> bool:
    return sorted(int(i) for i in order) == list(range(n))
