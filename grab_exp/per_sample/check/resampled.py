"""The resampled-batch check, for outputs the batch cannot split (a VAE's ``kl.mean()``; the
long form: docs/which-models-work.md): example ``i`` taken ``k_i`` times, the resampled batch's
loss must have the gradient ``sum_i k_i g_i / sum_i k_i`` of the rows."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.check.mean import rows_gaps
from grab_exp.per_sample.check.tolerance import TOLERANCE, tolerance
from grab_exp.per_sample.layout import Inputs, take

#: resampled batches per check (a pair of swapped rows escapes them all with probability 1/64)
DRAWS = 3
SEED = 0x5EED


def counts(batch: int, seed: int) -> torch.Tensor:
    """``(B,)`` how often each example is taken (0-3, seeded; at least one example taken)."""
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
    """The first resampled batch whose gradient the ``(B, d)`` rows of ``params`` do not give,
    as one line; ``None``. ``forward``: the model with a path's hooks idle; ``check``: the
    check's number (each check draws other batches)."""
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
