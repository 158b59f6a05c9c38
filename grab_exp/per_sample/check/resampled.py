"""The resampled-batch check, for outputs the batch cannot split (a VAE's ``kl.mean()``; the
long form: docs/which-models-work.md): example ``i`` taken ``k_i`` times, the resampled batch's
loss must have the gradient ``sum_i k_i g_i / sum_i k_i`` of the rows; with random layers active
(other masks in every forward) or no rows, its value the same mean of the examples' losses."""

from __future__ import annotations

import torch

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.check.mean import rows_norms, worst_gap
from grab_exp.per_sample.check.state import random_modules_off
from grab_exp.per_sample.check.tolerance import LOSS_TOLERANCE, MEAN_FLOOR, TOLERANCE, tolerance
from grab_exp.per_sample.layout import take

#: resampled batches per check (a pair of swapped rows escapes them all with probability 1/64)
DRAWS = 3
SEED = 0x5EED


def resampled_problem(forward, loss_fn, x, y, rows: BatchGrads, params: dict, check=0):
    """The first resampled batch whose gradient the ``(B, d)`` rows of ``params`` do not give,
    as one line (``str``); ``None``. ``forward``: the model with a path's hooks idle; ``check``:
    the check's number (each check draws other batches)."""
    for draw in range(DRAWS):
        counts, index = resampled(rows.rows, check, draw)
        if problem := counted_problem(forward, loss_fn, x, y, rows, params, counts, index):
            return problem
    return None


def counted_problem(forward, loss_fn, x, y, rows: BatchGrads, params: dict, counts, index):
    """Why the rows weighted by ``counts (B,)``, how often the batch ``index`` takes each
    example, do not give the gradient of that batch's loss, in one line; ``None``: they do."""
    names, tensors = list(params), list(params.values())
    loss = loss_fn(forward(take(x, index)), take(y, index))
    grads = torch.autograd.grad(loss, tensors, allow_unused=True)
    coef = (counts.to(rows.like.dtype) / counts.sum()).to(rows.like.device)  # (B,)
    gap, worst = worst_gap(rows_norms(rows, list(grads), coef), MEAN_FLOOR)
    if gap <= tolerance(TOLERANCE, rows.like.dtype):
        return None
    return (
        f"the rows of {names[worst]}, weighted by how often a batch drawn from this one takes each "
        f"example, differ from autograd's gradient of that batch's loss by {gap:.2g} (relative): "
        f"the loss is not the mean of the examples' own losses ({WHOLE}); per-sample gradients "
        "are undefined for it"
    )


#: what a value of the whole batch in the output may be (the refusals' guess)
WHOLE = (
    "a value of the whole batch in the output: a loss the model computes over the batch's tokens "
    "(labels= with -100 padding), a variance or a load-balancing term?"
)


def resampled(batch: int, check: int, draw: int) -> tuple[torch.Tensor, list[int]]:
    """How often a resampled batch takes each example, ``k (B,)`` (0-3, not all 0), and its
    index list; drawn from ``check`` and ``draw`` alone."""
    generator = torch.Generator().manual_seed(SEED + DRAWS * check + draw)
    k = torch.randint(0, 4, (batch,), generator=generator)  # (B,): 0-3 times each
    k[draw % batch] += int(not k.any())
    return k, torch.repeat_interleave(torch.arange(batch), k).tolist()


@torch.no_grad()
def resampled_values_problem(forward, loss_fn, x, y, batch: int, model, check=0) -> str | None:
    """The first resampled batch whose loss is not ``sum_i k_i l_i / sum_i k_i`` of the examples'
    losses alone, as one line; ``None``. The modules that draw random numbers run in eval mode,
    so that every forward is the same function."""
    with random_modules_off(model):
        return _values_problem(forward, loss_fn, x, y, batch, check)


def _values_problem(forward, loss_fn, x, y, batch: int, check: int) -> str | None:
    alone = torch.stack([loss_fn(forward(take(x, [i])), take(y, [i])) for i in range(batch)])
    for draw in range(DRAWS):
        k, index = resampled(batch, check, draw)
        got = loss_fn(forward(take(x, index)), take(y, index))
        weights = k.to(alone)
        want = (weights * alone).sum() / weights.sum()
        gap = float((got - want).abs() / (weights * alone.abs()).sum().mul(1 / weights.sum()))
        if not gap <= tolerance(LOSS_TOLERANCE, alone.dtype):  # NaN too
            return (
                f"the loss of a resampled batch (each example taken 0-3 times) differs from the "
                f"mean of its examples' own losses by {gap:.2g} (relative, random layers in eval "
                f"mode): the loss is not the mean of the examples' own losses ({WHOLE}); "
                "per-sample gradients are undefined for it"
            )
    return None
