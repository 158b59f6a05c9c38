"""``GraBSampler``: a GraB ordering for a ``DataLoader``, built from a name and the model."""

from __future__ import annotations

from collections.abc import Iterable, Sized
from typing import Any

import torch

from grab_exp.balance import Ordering, make_ordering
from grab_exp.validation import check_choice, check_int_at_least


def count_values(d: int | Iterable[torch.nn.Parameter] | None, balance: str) -> int:
    """``d`` as an int: given directly, or the trainable values of some parameters."""
    if d is None:
        choices = Ordering.choices()
        check_choice("balance", balance, choices)
        if choices[balance].needs_grads:
            raise ValueError(f"d: required by balance {balance!r}; pass an int or the parameters")
        return 1  # gradient-free orderings never look at d
    if isinstance(d, int):
        return d
    return sum(p.numel() for p in d if p.requires_grad)


def parameters_device(params: Iterable[torch.nn.Parameter]) -> torch.device | None:
    """The device of the first trainable parameter (where the per-sample gradients will be)."""
    return next((p.device for p in params if p.requires_grad), None)


def GraBSampler(  # noqa: N802  (a factory named like the Sampler it returns)
    data_source: Sized | int,
    d: int | Iterable[torch.nn.Parameter] | None = None,
    balance: str | Ordering = "mean",
    **kwargs: Any,
) -> Ordering:
    """The ordering ``balance`` over ``data_source``: itself a ``torch.utils.data.Sampler``.

    This factory exists for what the orderings' constructors cannot do: pick the class by name,
    count ``d`` from the model's parameters, and place the ordering on their device. Three-line
    use in a training loop::

        sampler = GraBSampler(dataset, model.parameters(), balance="mean")
        loader = DataLoader(dataset, batch_size=16, sampler=sampler)
        ...  # per batch: sampler.step(per_sample_grads); per epoch: sampler.set_epoch(e)

    Args:
        data_source: the dataset (anything with ``len``) or the number of examples.
        d: gradient length per example: an int, or the model's parameters.
        balance: an ordering name (``Ordering.choices()``) or a built :class:`Ordering`.
        **kwargs: the ordering's options (kernel, c, normalize, seed, depth, projection_dim,
            device, ...). Without ``device``, the ordering lives on the device of the
            parameters given as ``d`` (no copy of the ``(B, d)`` gradients to another device
            every step), else on the CPU.
    """
    n = data_source if isinstance(data_source, int) else len(data_source)
    check_int_at_least("n", n, 1)
    if isinstance(balance, Ordering):
        if balance.n != n:
            raise ValueError(f"balance: built for n={balance.n}, the data has n={n}")
        return balance
    if d is not None and not isinstance(d, int):
        d = list(d)  # parameters() is a one-pass generator
        kwargs.setdefault("device", parameters_device(d) or "cpu")
    return make_ordering(balance, n, count_values(d, balance), **kwargs)
