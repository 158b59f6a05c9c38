"""A per-sample path's step against a plain step from one seed (models that draw random numbers)."""

from __future__ import annotations

import torch


def assert_a_plain_step_from_one_seed(psg, model, loss_fn, x, y, seed: int) -> None:
    """``psg(x, y)`` and a plain ``loss_fn(model(x), y).backward()``, each from ``seed``: the same
    loss and ``param.grad`` (a model that draws random numbers: the batch's own draws; what the
    path's probes and checks draw, they draw from forked generators). ``param.grad`` is cleared
    before each and after."""
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    loss, _ = psg(x, y)
    got = {n: p.grad for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    torch.manual_seed(seed)
    plain = loss_fn(model(*x) if isinstance(x, tuple) else model(x), y)
    plain.backward()
    torch.testing.assert_close(loss, plain.detach())
    for n, p in model.named_parameters():
        torch.testing.assert_close(got[n], p.grad, msg=n)
    model.zero_grad(set_to_none=True)
