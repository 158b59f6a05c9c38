"""The resampled-batch check: the rows against autograd's gradient of a resampled batch's loss.

Take example ``i`` of the batch ``k_i`` times (``k_i`` in 0-3, drawn from a generator of its
own; ``n = sum_i k_i``). A model that does not mix examples and a loss that keeps the contract
give ``loss_fn(model(x[index]), y[index]) = sum_i k_i loss_i / n``, so its gradient must be
``sum_i (k_i / n) g_i``: one forward and backward of the resampled batch and one pass over the
rows. Unlike the checks that split the batch's output (:mod:`~grab_exp.per_sample.check`), it
reads nothing of the output: a model that returns a batch-mean scalar beside its outputs (a
VAE's ``kl.mean()``) or a loss that reads an activation the model stored is compared as any
other. Rows attributed to the wrong examples show wherever their counts differ (a pair of
swapped rows with probability 3/4 a draw), a model that mixes examples and a loss that is not a
per-example mean show as a gap.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.check.mean import rows_gaps
from grab_exp.per_sample.check.tolerance import TOLERANCE, tolerance
from grab_exp.per_sample.layout import Inputs, take

#: resampled batches per check: a pair of swapped rows escapes all of them with probability
#: (1/4) ** DRAWS
DRAWS = 3
SEED = 0x5EED


def counts(batch: int, seed: int) -> torch.Tensor:
    """``(B,)`` how many times each example is taken in a resampled batch (0-3, drawn from a
    generator seeded with ``seed``; at least one example taken)."""
    generator = torch.Generator().manual_seed(SEED + seed)
    k = torch.randint(0, 4, (batch,), generator=generator)
    if not k.any():
        k[seed % batch] = 1
    return k


def resampled_problem(
    forward: Callable[[Inputs], Any],
    loss_fn: Callable[[Any, Any], torch.Tensor],
    x: Inputs,
    y: Any,
    rows: BatchGrads,
    params: dict[str, nn.Parameter],
    check: int = 0,
) -> str | None:
    """The first resampled batch whose gradient the rows do not give, as one line; ``None``.

    Args:
        forward: the model as a plain function of its inputs (a path's hooks idle).
        loss_fn: the batch-mean loss.
        x, y: the batch (``B`` examples in dimension 0).
        rows: the ``(B, d)`` rows of ``params``, in their order.
        params: the trainable parameters by name.
        check: the check's number (each check draws other batches).
    """
    names, tensors = list(params), list(params.values())
    limit = tolerance(TOLERANCE, rows.like.dtype)
    for draw in range(DRAWS):
        k = counts(rows.rows, DRAWS * check + draw)  # (B,)
        index = torch.repeat_interleave(torch.arange(rows.rows), k).tolist()
        loss = loss_fn(forward(take(x, index)), take(y, index))
        grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        coef = (k.to(rows.like.dtype) / k.sum()).to(rows.like.device)  # (B,)
        gaps = rows_gaps(rows, list(grads), loss, coef)  # (P,)
        worst = int(gaps.nan_to_num(nan=float("inf")).argmax())
        if float(gaps[worst]) > limit:
            return (
                f"the rows of {names[worst]}, weighted by how often a resampled batch takes "
                f"each example, differ from autograd's gradient of that batch's loss by "
                f"{float(gaps[worst]):.2g} (relative): the loss is not the mean of the examples' "
                "own losses (the model's output has a value of the whole batch, without a batch "
                "dimension: a variance or load-balancing term?), or the rows are not the "
                "examples'; per-sample gradients are undefined for such a loss"
            )
    return None
