"""Plain per-example reference orderings, written from each variant's "Exact semantics" spec.

Deliberately slow and literal: one example (or one pair) at a time, Python lists for the
orders, float64 tensors for the vectors. Every function takes the current order (a list of
example ids), the gradient matrix ``z`` (row ``i`` is the flattened gradient of example ``i``)
and returns the next order. ``steps`` (default: all) is how many examples of the order were
visited before the epoch ended; the unvisited rest keeps its relative order at the end.
``sign(v, acc)`` is the kernel; the default is the deterministic one.
"""

from __future__ import annotations

import torch


def deterministic_sign(v: torch.Tensor, acc: torch.Tensor) -> int:
    """+1 iff <v, acc> < 0 (strict: acc = 0 gives -1)."""
    return 1 if float(torch.dot(v, acc)) < 0 else -1


def _visited(order: list[int], steps: int | None) -> tuple[list[int], list[int]]:
    k = len(order) if steps is None else steps
    return list(order[:k]), list(order[k:])


def _stale_mean(z: torch.Tensor, visited: list[int], m: torch.Tensor) -> torch.Tensor:
    """Mean of the raw gradients seen this epoch (kept unchanged if nothing was seen)."""
    if not visited:
        return m
    total = torch.zeros_like(z[0])
    for i in visited:
        total = total + z[i]
    return total / len(visited)


def mean_balance(order, z, m, *, steps=None, sign=deterministic_sign):
    """Vanilla GraB. Returns (next_order, stale mean for the next epoch)."""
    visited, rest = _visited(order, steps)
    acc = torch.zeros_like(z[0])
    positives, negatives = [], []
    for i in visited:
        v = z[i] - m
        s = sign(v, acc)
        acc = acc + s * v
        (positives if s > 0 else negatives).append(i)
    return positives + negatives[::-1] + rest, _stale_mean(z, visited, m)


def batch_balance(order, z, m, batch_size, *, steps=None, sign=deterministic_sign):
    """Like mean, but every sign of a mini-batch is taken against acc at its start."""
    visited, rest = _visited(order, steps)
    acc = torch.zeros_like(z[0])
    positives, negatives = [], []
    for start in range(0, len(visited), batch_size):
        acc_start = acc
        for i in visited[start : start + batch_size]:
            v = z[i] - m
            s = sign(v, acc_start)
            acc = acc + s * v
            (positives if s > 0 else negatives).append(i)
    return positives + negatives[::-1] + rest, _stale_mean(z, visited, m)


def recursive_balance(order, z, m, depth, *, steps=None, sign=deterministic_sign):
    """Binary tree of accumulators; heap numbering: root 0, children 2k+1 (left), 2k+2."""
    visited, rest = _visited(order, steps)
    n_nodes = 2 ** (depth + 1) - 1
    accs = [torch.zeros_like(z[0]) for _ in range(n_nodes)]
    first_leaf = 2**depth - 1
    positives = {leaf: [] for leaf in range(first_leaf, n_nodes)}
    negatives = {leaf: [] for leaf in range(first_leaf, n_nodes)}
    for i in visited:
        v = z[i] - m
        node = 0
        for level in range(depth + 1):
            s = sign(v, accs[node])
            accs[node] = accs[node] + s * v
            if level < depth:
                node = 2 * node + 1 if s > 0 else 2 * node + 2
            else:
                (positives if s > 0 else negatives)[node].append(i)
    out = []
    for leaf in range(first_leaf, n_nodes):  # leaves, left to right
        out += positives[leaf] + negatives[leaf][::-1]
    return out + rest, _stale_mean(z, visited, m)


def pair_balance(order, z, *, steps=None, sign=deterministic_sign):
    """CD-GraB pair balance, one worker; pairs may straddle mini-batches; no stale mean."""
    visited, rest = _visited(order, steps)
    acc = torch.zeros_like(z[0])
    positives, negatives = [], []
    for k in range(len(visited) // 2):
        first, second = visited[2 * k], visited[2 * k + 1]
        v = z[first] - z[second]
        s = sign(v, acc)
        acc = acc + s * v
        if s > 0:
            positives.append(first)
            negatives.append(second)
        else:
            positives.append(second)
            negatives.append(first)
    if len(visited) % 2 == 1:  # the unpaired last example joins the positives
        positives.append(visited[-1])
    return positives + negatives[::-1] + rest


def recursive_pair_balance(order, z, batch_size, *, steps=None, sign=deterministic_sign):
    """Recursive pair balance over mini-batches of ``batch_size`` (a power of two)."""
    visited, rest = _visited(order, steps)
    b = batch_size
    accs: dict[int, torch.Tensor] = {}

    def balance_group(group: list[int], node: int) -> list[int]:
        if len(group) == 1:
            return group
        acc = accs.get(node, torch.zeros_like(z[0]))  # as it stood before this group
        left, right = [], []
        total = torch.zeros_like(z[0])
        for k in range(len(group) // 2):
            first, second = group[2 * k], group[2 * k + 1]
            v = z[first] - z[second]
            s = sign(v, acc)
            total = total + s * v
            left.append(first if s > 0 else second)
            right.append(second if s > 0 else first)
        accs[node] = acc + total
        return balance_group(left, 2 * node + 1) + balance_group(right, 2 * node + 2)

    n_full = len(visited) // b
    results = [balance_group(visited[j * b : (j + 1) * b], 0) for j in range(n_full)]
    out = []
    for p in range(b):
        batches = results if p % 2 == 0 else results[::-1]
        out += [result[p] for result in batches]
    return out + visited[n_full * b :] + rest


def reference_next(name, order, z, state, *, batch_size, depth=5, steps=None, sign=None):
    """One epoch of the named reference. ``state`` is the stale mean (mean/batch/recursive)."""
    kw = {"steps": steps, "sign": sign or deterministic_sign}
    if name == "mean":
        return mean_balance(order, z, state, **kw)
    if name == "batch":
        return batch_balance(order, z, state, batch_size, **kw)
    if name == "recursive":
        return recursive_balance(order, z, state, depth, **kw)
    if name == "pair":
        return pair_balance(order, z, **kw), state
    if name == "recursive_pair":
        return recursive_pair_balance(order, z, batch_size, **kw), state
    raise KeyError(name)


def reference_orders(name, first_order, zs, *, batch_size, depth=5, steps=None):
    """Orders of epochs 0..len(zs), epoch e fed the gradients ``zs[e]``."""
    orders = [list(first_order)]
    state = torch.zeros_like(zs[0][0])
    for z in zs:
        nxt, state = reference_next(
            name, orders[-1], z, state, batch_size=batch_size, depth=depth, steps=steps
        )
        orders.append(nxt)
    return orders
