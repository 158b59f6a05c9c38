"""``GraBSampler``: a ``torch.utils.data.Sampler`` driven by a GraB ordering."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sized
from typing import Any

import torch
from torch.utils.data import Sampler

from grab_exp.balance import Balance, make_balance
from grab_exp.validation import check_choice, check_int_at_least


def count_values(d: int | Iterable[torch.nn.Parameter] | None, balance: str) -> int:
    """``d`` as an int: given directly, or the trainable values of some parameters."""
    if d is None:
        check_choice("balance", balance, Balance.registry)
        if Balance.registry[balance].needs_grads:
            raise ValueError(f"d: required by balance {balance!r}; pass an int or the parameters")
        return 1  # gradient-free orderings never look at d
    if isinstance(d, int):
        return d
    return sum(p.numel() for p in d if p.requires_grad)


def parameters_device(params: Iterable[torch.nn.Parameter]) -> torch.device | None:
    """The device of the first trainable parameter (where the per-sample gradients will be)."""
    return next((p.device for p in params if p.requires_grad), None)


class GraBSampler(Sampler[int]):
    """Yields dataset indices in the order chosen by a balance variant.

    Three-line use in a training loop::

        sampler = GraBSampler(dataset, model.parameters(), balance="mean")
        loader = DataLoader(dataset, batch_size=16, sampler=sampler)
        ...  # per batch: sampler.step(per_sample_grads); per epoch: sampler.set_epoch(e)

    Args:
        data_source: the dataset (anything with ``len``) or the number of examples.
        d: gradient length per example: an int, or the model's parameters.
        balance: a variant name (``Balance.registry``) or a built ``Balance``.
        **kwargs: the variant's options (kernel, c, normalize, seed, depth, projection_dim,
            device, ...). Without ``device``, the ordering lives on the device of the
            parameters given as ``d`` (no copy of the ``(B, d)`` gradients to another device
            every step), else on the CPU.
    """

    def __init__(
        self,
        data_source: Sized | int,
        d: int | Iterable[torch.nn.Parameter] | None = None,
        balance: str | Balance = "mean",
        **kwargs: Any,
    ) -> None:
        n = data_source if isinstance(data_source, int) else len(data_source)
        check_int_at_least("n", n, 1)
        if isinstance(balance, Balance):
            if balance.n != n:
                raise ValueError(f"balance: built for n={balance.n}, the data has n={n}")
            self.balance = balance
        else:
            if d is not None and not isinstance(d, int):
                d = list(d)  # parameters() is a one-pass generator
                kwargs.setdefault("device", parameters_device(d) or "cpu")
            self.balance = make_balance(balance, n, count_values(d, balance), **kwargs)

    def __iter__(self) -> Iterator[int]:
        return iter(self.balance.order.tolist())

    def __len__(self) -> int:
        return self.balance.n

    @property
    def needs_grads(self) -> bool:
        """Whether :meth:`step` needs the per-sample gradients (false for rr, so, fixed)."""
        return self.balance.needs_grads

    @property
    def takes_factors(self) -> bool:
        """Whether factored per-sample gradients save work in :meth:`step`."""
        return self.balance.takes_factors

    @property
    def epoch(self) -> int:
        """The current epoch."""
        return self.balance.epoch

    def index_batches(self, batch_size: int, drop_last: bool = False) -> Iterator[torch.Tensor]:
        """The current order as ``(batch_size,)`` index tensors on the sampler's device."""
        check_int_at_least("batch_size", batch_size, 1)
        order = self.balance.order
        stop = len(order) - len(order) % batch_size if drop_last else len(order)
        for start in range(0, stop, batch_size):
            yield order[start : start + batch_size]

    def step(self, grads=None, indices: torch.Tensor | None = None) -> None:
        """Feed per-sample gradients of the next batch (see ``Balance.step``)."""
        self.balance.step(grads, indices)

    def set_epoch(self, epoch: int) -> None:
        """Advance to ``epoch``; the next order is computed from the stepped gradients."""
        self.balance.set_epoch(epoch)

    def state_bytes(self) -> int:
        """Bytes of the ordering's balancing state (see ``Balance.state_bytes``)."""
        return self.balance.state_bytes()

    def state_dict(self) -> dict[str, Any]:
        """The ordering's full state (see ``Balance.state_dict``)."""
        return self.balance.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``."""
        self.balance.load_state_dict(state)
