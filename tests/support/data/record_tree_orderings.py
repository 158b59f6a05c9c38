"""Record the orders and accumulators of recursive and recursive_pair, for
``tests/balance/test_tree_orderings_unchanged.py``.

Recorded with the package of commit a98284e (the all-node-product implementation, before the
per-level one of issue 21): ``git worktree add /tmp/a98284e a98284e`` and
``PYTHONPATH=/tmp/a98284e python tests/support/data/record_tree_orderings.py``. The file keeps
the commit of the package that made it (the test checks it is a98284e); the test feeds the same
gradients to today's code and compares.
"""

from __future__ import annotations

import itertools
import subprocess
from pathlib import Path

import torch

import grab_exp
from grab_exp.balance import make_ordering

N, D, EPOCHS = 48, 30, 3
OUT = Path(__file__).with_name("tree_orderings.pt")
#: (variant, options, step size): recursive steps of 5 (a short last step), recursive_pair b = 8
CASES = {
    "recursive-D0": ("recursive", {"depth": 0}, 5),
    "recursive-D1": ("recursive", {"depth": 1}, 5),
    "recursive-D5": ("recursive", {"depth": 5}, 5),
    "recursive_pair-b8": ("recursive_pair", {"batch_size": 8}, 8),
}
KERNELS = ("deterministic", "probabilistic")
DTYPES = {"float64": torch.float64, "float32": torch.float32}


def grads(epoch: int, start: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``(rows, D)`` gradients of visit positions ``start ..`` in ``epoch`` (seeded)."""
    g = torch.Generator().manual_seed(1000 * epoch + start)
    return torch.randn(rows, D, generator=g, dtype=torch.float64).to(dtype)


def run(variant: str, options: dict, step: int, kernel: str, normalize: bool, dtype) -> dict:
    """Each epoch's order and its accumulators at the epoch's end (before the reset)."""
    ordering = make_ordering(
        variant, N, D, kernel=kernel, c=2.0, normalize=normalize, seed=3, dtype=dtype, **options
    )
    orders, accs = [], []
    for epoch in range(EPOCHS):
        ordering.set_epoch(epoch)
        orders.append(ordering.order.clone())
        for start in range(0, N, step):
            rows = min(step, N - start)
            ordering.step(grads(epoch, start, rows, dtype))
        accs.append(ordering.state_dict()["acc"].clone())
    return {"orders": torch.stack(orders), "acc": torch.stack(accs)}


def main() -> None:
    records = {}
    for (case, (variant, options, step)), kernel, normalize, dtype in itertools.product(
        CASES.items(), KERNELS, (False, True), DTYPES
    ):
        key = f"{case}-{kernel}-normalize{int(normalize)}-{dtype}"
        records[key] = run(variant, options, step, kernel, normalize, DTYPES[dtype])
    package = Path(grab_exp.__file__).parent
    head = ["git", "-C", str(package), "rev-parse", "HEAD"]
    commit = subprocess.run(head, capture_output=True, text=True, check=True).stdout.strip()
    torch.save({"commit": commit, "cases": records}, OUT)
    print(f"{len(records)} cases of commit {commit[:7]} written to {OUT}")


if __name__ == "__main__":
    main()
