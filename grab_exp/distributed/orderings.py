"""Orderings across ``W`` workers: the shared base, ``d_rr`` and ``d_grab``.

Each worker owns a shard of ``m`` global example indices (:func:`split_shards`) and visits
it in its own order each epoch. An ordering object serves the ``L`` workers its process
runs (``comm.local_ranks``): one in a real ``torch.distributed`` job, all ``W`` in the
simulator. Gradients arrive worker-major: rows ``l * B .. (l + 1) * B - 1`` are worker
``local_ranks[l]``'s mini-batch, the next ``B`` examples of its order.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, ClassVar

import torch

from grab_exp.balance import make_balance
from grab_exp.distributed.comm import Communicator
from grab_exp.distributed.shards import rank_seeds
from grab_exp.grads.batch import flatten_grads
from grab_exp.validation import check_choice, check_int_at_least


class DistributedOrdering:
    """Base class: per-worker orders over the local workers' shards.

    Args:
        shards: ``(W, m)`` global example indices, row ``r`` owned by worker ``r``.
        d: length of one flattened per-sample gradient.
        comm: the communicator (``world_size`` must be ``W``).
        seed: the run's seed (each worker derives its own from it, see :func:`rank_seeds`).
        device: device of the orders and of the balancing state.
    """

    name: ClassVar[str] = ""
    needs_grads: ClassVar[bool] = True
    takes_factors: ClassVar[bool] = False  # the workers' rows are materialized on entry
    registry: ClassVar[dict[str, type[DistributedOrdering]]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.name:
            DistributedOrdering.registry[cls.name] = cls

    def __init__(
        self,
        shards: torch.Tensor,
        d: int,
        comm: Communicator,
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
    ) -> None:
        check_int_at_least("d", d, 1)
        if shards.dim() != 2 or shards.shape[0] != comm.world_size:
            raise ValueError(f"shards: expected ({comm.world_size}, m); got {tuple(shards.shape)}")
        self.comm, self.d, self.device = comm, d, torch.device(device)
        self.world_size, self.m = shards.shape
        self.lanes = list(comm.local_ranks)
        self.shards = shards[self.lanes].to(self.device)  # (L, m)
        self.seeds = [rank_seeds(seed, self.world_size)[r] for r in self.lanes]
        self.bytes_sent = 0  # per worker, since construction
        self.last_bytes_sent = 0  # per worker, last step

    # --- hooks ---------------------------------------------------------------------
    @property
    def local_order(self) -> torch.Tensor:
        """``(L, m)`` positions into each local shard, the current epoch's visit order."""
        raise NotImplementedError

    @property
    def epoch(self) -> int:
        """The current epoch."""
        raise NotImplementedError

    def _step(self, flat: torch.Tensor) -> None:
        """Consume ``(L, B, d)`` per-sample gradients."""

    def _set_epoch(self, epoch: int) -> None:
        raise NotImplementedError

    # --- public API ------------------------------------------------------------------
    @property
    def orders(self) -> torch.Tensor:
        """``(L, m)`` global example indices in each local worker's visit order."""
        return torch.gather(self.shards, 1, self.local_order)

    def index_batches(self, batch_size: int) -> Iterator[torch.Tensor]:
        """The current orders as ``(L, B)`` global index batches (the last may be shorter)."""
        check_int_at_least("batch_size", batch_size, 1)
        orders = self.orders
        for start in range(0, self.m, batch_size):
            yield orders[:, start : start + batch_size]

    def __len__(self) -> int:
        """Examples per worker (``m``)."""
        return self.m

    def step(
        self,
        grads: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
        indices: torch.Tensor | None = None,
    ) -> None:
        """Feed the per-sample gradients of the local workers' next mini-batches.

        Args:
            grads: ``(L * B, ...)`` tensor or dict of ``(L * B, ...)`` tensors, worker-major
                (as the pipeline returns for the flattened ``(L, B)`` index batch).
            indices: ``(L * B,)`` the batch's global indices; accepted for the training step's
                common call, not checked (the orders are this object's own).
        """
        if not self.needs_grads:
            return
        if grads is None:
            raise ValueError(f"{self.name}: step needs the per-sample gradients; got None")
        flat = flatten_grads(grads, self.d)  # (L * B, d)
        lanes = len(self.lanes)
        if flat.shape[0] % lanes:
            raise ValueError(f"step: {flat.shape[0]} rows do not split over {lanes} workers")
        self._step(flat.reshape(lanes, flat.shape[0] // lanes, self.d))

    def set_epoch(self, epoch: int) -> None:
        """Advance to ``epoch``; the next orders come from the stepped gradients."""
        check_int_at_least("epoch", epoch, self.epoch)
        self._set_epoch(epoch)

    def state_dict(self) -> dict[str, Any]:
        """The ordering's state (for checkpoints and cross-rank checks)."""
        raise NotImplementedError

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()``."""
        raise NotImplementedError


class _PerWorkerBalance(DistributedOrdering):
    """Every local worker runs its own single-worker ordering on its shard."""

    balance_name: ClassVar[str] = ""

    def __init__(self, shards, d, comm, *, seed=0, device="cpu", **balance_kwargs) -> None:
        super().__init__(shards, d, comm, seed=seed, device=device)
        self.balances = [
            make_balance(self.balance_name, self.m, d, seed=s, device=self.device, **balance_kwargs)
            for s in self.seeds
        ]

    @property
    def local_order(self) -> torch.Tensor:
        return torch.stack([b.order for b in self.balances])  # (L, m)

    @property
    def epoch(self) -> int:
        return self.balances[0].epoch

    def _step(self, flat: torch.Tensor) -> None:
        for lane, balance in enumerate(self.balances):
            balance.step(flat[lane])  # (B, d)

    def _set_epoch(self, epoch: int) -> None:
        for balance in self.balances:
            balance.set_epoch(epoch)

    def state_bytes(self) -> int:
        """Bytes of the local workers' ordering state."""
        return sum(b.state_bytes() for b in self.balances)

    def state_dict(self) -> dict[str, Any]:
        return {"variant": self.name, "workers": [b.state_dict() for b in self.balances]}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        for balance, worker in zip(self.balances, state["workers"], strict=True):
            balance.load_state_dict(worker)


class DistributedRandomReshuffle(_PerWorkerBalance):
    """``d_rr``: every worker reshuffles its shard each epoch (seeded per rank)."""

    name = "d_rr"
    needs_grads = False
    balance_name = "rr"


class IndependentGraB(_PerWorkerBalance):
    """``d_grab``: every worker runs pair balance on its own shard, no coordination."""

    name = "d_grab"
    balance_name = "pair"


def make_distributed_ordering(
    name: str, shards: torch.Tensor, d: int, comm: Communicator, **kwargs: Any
) -> DistributedOrdering:
    """Build ``d_rr`` | ``d_grab`` | ``cd_grab`` (``DistributedOrdering.registry``).

    ``kwargs`` are the ordering's options; ``d_rr`` ignores the gradient ones.
    """
    import grab_exp.distributed.cd_grab  # noqa: F401  (registers cd_grab)

    check_choice("balance", name, DistributedOrdering.registry)
    cls = DistributedOrdering.registry[name]
    if name == "d_rr":
        kwargs = {k: v for k, v in kwargs.items() if k in ("seed", "device", "first_epoch")}
    elif name == "d_grab":
        kwargs = {k: v for k, v in kwargs.items() if not k.startswith("projection")}
    return cls(shards, d, comm, **kwargs)
