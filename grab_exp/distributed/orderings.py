"""Orderings across ``W`` workers: the shared base, ``d_rr`` and ``d_grab``.

Each worker owns a shard of ``m`` global example indices (:func:`split_shards`) and visits
it in its own order each epoch. An ordering object serves the ``L`` workers its process
runs (``comm.local_ranks``): one in a real ``torch.distributed`` job, all ``W`` in the
simulator. It is an :class:`~grab_exp.balance.Ordering` with lanes ``(L,)``: ``order`` and
``keys`` are ``(L, m)`` positions into the local shards. Gradients arrive worker-major: rows
``l * B .. (l + 1) * B - 1`` are worker ``local_ranks[l]``'s mini-batch, the next ``B``
examples of its order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import torch

from grab_exp.balance import Ordering, make_ordering
from grab_exp.distributed.comm import Communicator
from grab_exp.distributed.shards import rank_seeds
from grab_exp.grads.batch import flatten_grads


class DistributedOrdering(Ordering):
    """Base class: per-worker orders over the local workers' shards.

    Args:
        shards: ``(W, m)`` global example indices, row ``r`` owned by worker ``r``.
        d: length of one flattened per-sample gradient.
        comm: the communicator (``world_size`` must be ``W``).
        seed: the run's seed (each worker derives its own from it, see :func:`rank_seeds`).
        device: device of the orders and of the balancing state.
        **options: the :class:`~grab_exp.balance.Ordering` options the ordering uses (a
            gradient ordering's, :class:`~grab_exp.balance.GradientOrdering`, with it).
    """

    distributed = True
    reads_factors: ClassVar[bool] = False  # the workers' rows are materialized on entry

    def __init__(
        self,
        shards: torch.Tensor,
        d: int,
        comm: Communicator,
        *,
        seed: int = 0,
        device: torch.device | str = "cpu",
        **options: Any,
    ) -> None:
        if shards.dim() != 2 or shards.shape[0] != comm.world_size:
            raise ValueError(f"shards: expected ({comm.world_size}, m); got {tuple(shards.shape)}")
        self.comm = comm
        self.world_size, m = shards.shape
        self.ranks = list(comm.local_ranks)
        self.shards = shards[self.ranks].to(device)  # (L, m)
        self.seeds = [rank_seeds(seed, self.world_size)[r] for r in self.ranks]
        self.bytes_sent = 0  # per worker, since construction
        self.last_bytes_sent = 0  # per worker, last step
        super().__init__(m, d, seed=seed, device=device, lanes=(len(self.ranks),), **options)

    @property
    def m(self) -> int:
        """Examples per worker."""
        return self.n

    @property
    def orders(self) -> torch.Tensor:
        """``(L, m)`` global example indices in each local worker's visit order."""
        return self.visit_order

    def _identity(self) -> dict[str, Any]:
        """The base's, and the workers this process runs (a state is theirs alone)."""
        return {**super()._identity(), "ranks": list(self.ranks)}

    def _dataset_indices(self, positions: torch.Tensor) -> torch.Tensor:
        return torch.gather(self.shards, 1, positions)  # (L, k)

    def _rows_per_lane(self, rows: int) -> int:
        lanes = len(self.ranks)
        if rows % lanes:
            raise ValueError(f"step: {rows} rows do not split over {lanes} workers")
        return rows // lanes

    def _grad_rows(self, grads: torch.Tensor | Mapping[str, torch.Tensor]) -> torch.Tensor:
        """``(L, B, d)``: each local worker's rows, materialized."""
        flat = flatten_grads(grads, self.d)  # (L * B, d)
        return flat.reshape(len(self.ranks), -1, self.d)

    def _first_order(self, first_epoch: str) -> torch.Tensor:
        """Each worker's own seeded permutation of its shard (``first_epoch`` as for one)."""
        if first_epoch == "identity":
            return torch.arange(self.m, device=self.device).expand(len(self.ranks), -1).clone()
        orders = []
        for seed in self.seeds:
            generator = torch.Generator(device=self.device).manual_seed(seed)
            orders.append(torch.randperm(self.m, generator=generator, device=self.device))
        return torch.stack(orders)  # (L, m)


class _PerWorkerOrdering(DistributedOrdering):
    """Every local worker runs its own single-process ordering on its shard, no coordination.

    Its ``order`` is the stack of the workers' orders; their keys, generators and balancing
    state stay theirs (a checkpoint holds one ``state_dict`` per worker), so ``keys`` is empty.
    """

    worker_ordering: ClassVar[str] = ""

    def __init__(self, shards, d, comm, *, seed=0, device="cpu", **options) -> None:
        self._worker_options = options
        super().__init__(shards, d, comm, seed=seed, device=device)

    def _first_order(self, first_epoch: str) -> torch.Tensor:
        """Build each worker's ordering (seeded per rank); their first orders are the first."""
        self.workers = [
            make_ordering(self.worker_ordering, self.m, self.d, seed=seed, device=self.device,
                          **self._worker_options)
            for seed in self.seeds
        ]  # fmt: skip
        return self._stacked_orders()

    def _stacked_orders(self) -> torch.Tensor:
        return torch.stack([worker.order for worker in self.workers])  # (L, m)

    def _fresh_keys(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.long, device=self.device)  # the workers keep theirs

    def _take(self, grads: Any, positions: torch.Tensor) -> None:
        if self.needs_grads:  # each worker's own rows (B, d)
            for worker, rows in zip(self.workers, self._grad_rows(grads), strict=True):
                worker.step(rows)

    def _advance(self) -> None:  # the workers warn of examples they were not given
        self._index_check.raise_if_bad()
        for worker in self.workers:
            worker.set_epoch(self.epoch + 1)
        self.order = self._stacked_orders()
        self.epoch, self.pos = self.epoch + 1, 0

    def state_bytes(self) -> int:
        """Bytes of the local workers' ordering state."""
        return sum(worker.state_bytes() for worker in self.workers)

    def state_dict(self) -> dict[str, Any]:
        self._index_check.raise_if_bad()
        workers = [worker.state_dict() for worker in self.workers]
        return {"variant": self.name, "epoch": self.epoch, "pos": self.pos, "workers": workers}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` (one written before ``epoch`` and ``pos`` were kept here
        takes them from its first worker: it was written at an epoch boundary)."""
        if state.get("variant") != self.name:
            raise ValueError(
                f"state_dict: variant is {state.get('variant')!r}, this ordering has {self.name!r}"
            )
        if len(state["workers"]) != len(self.workers):
            raise ValueError(
                f"state_dict: has {len(state['workers'])} workers, this process runs "
                f"{len(self.workers)}"
            )
        for worker, saved in zip(self.workers, state["workers"], strict=True):
            worker.load_state_dict(saved)
        self.order = self._stacked_orders()
        self.epoch = int(state.get("epoch", self.workers[0].epoch))
        self.pos = int(state.get("pos", self.workers[0].pos))


class DistributedRandomReshuffle(_PerWorkerOrdering):
    """``d_rr``: every worker reshuffles its shard each epoch (seeded per rank)."""

    name = "d_rr"
    worker_ordering = "rr"


class IndependentGraB(_PerWorkerOrdering):
    """``d_grab``: every worker runs pair balance on its own shard, no coordination."""

    name = "d_grab"
    needs_grads = True
    worker_ordering = "pair"
