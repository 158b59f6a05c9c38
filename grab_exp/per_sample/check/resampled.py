"""The resampled-batch check, for outputs the batch cannot split (a VAE's ``kl.mean()``; the
long form: docs/which-models-work.md): example ``i`` taken ``k_i`` times, the resampled batch's
loss must have the gradient ``sum_i k_i g_i / sum_i k_i`` of the rows."""

from __future__ import annotations

import torch

from grab_exp.grads import BatchGrads
from grab_exp.per_sample.check.mean import rows_norms, worst_gap
from grab_exp.per_sample.check.tolerance import MEAN_FLOOR, TOLERANCE, tolerance
from grab_exp.per_sample.layout import take

#: resampled batches per check (a pair of swapped rows escapes them all with probability 1/64)
DRAWS = 3
SEED = 0x5EED


def resampled_problem(forward, loss_fn, x, y, rows: BatchGrads, params: dict, check=0):
    """The first resampled batch whose gradient the ``(B, d)`` rows of ``params`` do not give,
    as one line (``str``); ``None``. ``forward``: the model with a path's hooks idle; ``check``:
    the check's number (each check draws other batches)."""
    names, tensors = list(params), list(params.values())
    for draw in range(DRAWS):
        generator = torch.Generator().manual_seed(SEED + DRAWS * check + draw)
        k = torch.randint(0, 4, (rows.rows,), generator=generator)  # (B,): 0-3 times each
        k[draw % rows.rows] += int(not k.any())
        index = torch.repeat_interleave(torch.arange(rows.rows), k).tolist()
        loss = loss_fn(forward(take(x, index)), take(y, index))
        grads = torch.autograd.grad(loss, tensors, allow_unused=True)
        coef = (k.to(rows.like.dtype) / k.sum()).to(rows.like.device)  # (B,)
        gap, worst = worst_gap(rows_norms(rows, list(grads), coef), MEAN_FLOOR)
        if gap > tolerance(TOLERANCE, rows.like.dtype):
            return (
                f"the rows of {names[worst]}, weighted by how often a resampled batch takes "
                f"each example, differ from autograd's gradient of that batch's loss by "
                f"{gap:.2g} (relative): the loss is not the mean of the examples' "
                "own losses (a value of the whole batch in the output: a variance or "
                "load-balancing term?); per-sample gradients are undefined for it"
            )
    return None
