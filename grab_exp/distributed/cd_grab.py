"""``cd_grab``: coordinated distributed pair balance (Cooper et al., NeurIPS 2023).

At every step each worker forms the differences of its consecutive example pairs
(``B / 2`` of them), optionally sketched to ``k`` numbers; the workers all-gather them and
every process runs the *same* pair balance over the gathered differences with one shared
accumulator, visiting them pair-major: first pair of rank 0, first pair of rank 1, ..., first
pair of rank ``W - 1``, then the second pairs, and so on. A ``+`` sends the pair's first
example to the front (positives, visit order) and its second to the back (negatives,
reverse visit order) of its own worker's next order; ``-`` does the reverse. All processes
hold bitwise-identical balancing state (accumulator, kernel generator); each keeps the next
orders of its own workers.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch

from grab_exp.balance.kernels import make_kernel
from grab_exp.balance.projection import BlockProjection
from grab_exp.balance.signs import UNVISITED_KEY, sequential_signs, sign_keys
from grab_exp.balance.tensors import as_dtype
from grab_exp.distributed.orderings import DistributedOrdering
from grab_exp.grads.rows import normalize_rows


class CoordinatedGraB(DistributedOrdering):
    """``cd_grab``. Options beyond :class:`DistributedOrdering`'s:

    Args:
        kernel: ``deterministic`` | ``probabilistic`` (thresholds from a generator seeded
            with ``seed`` on every process, so all draw the same).
        c: the probabilistic kernel's scale.
        normalize: scale every pair difference to unit norm before sketching.
        projection_dim: ``None`` (send ``d`` values per pair) or ``k`` (send a seeded
            ``k``-dimensional sketch, see :class:`BlockProjection`).
        projection_block_rows: rows of the projection generated at once.
        dtype: dtype of the balancing state and of what is sent.
    """

    name = "cd_grab"

    def __init__(
        self,
        shards: torch.Tensor,
        d: int,
        comm,
        *,
        kernel: str = "deterministic",
        c: float = 30.0,
        normalize: bool = False,
        projection_dim: int | None = None,
        projection_block_rows: int = 4096,
        seed: int = 0,
        dtype: torch.dtype | str = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__(shards, d, comm, seed=seed, device=device)
        self.kernel, self.normalize = make_kernel(kernel, c), bool(normalize)
        self.dtype = as_dtype(dtype)
        self.projection = None
        if projection_dim is not None:
            self.projection = BlockProjection(
                d,
                projection_dim,
                seed=seed,
                block_rows=projection_block_rows,
                dtype=self.dtype,
                device=self.device,
            )
        self.width = d if self.projection is None else projection_dim  # values sent per pair
        self.generator = torch.Generator(device=self.device).manual_seed(seed)  # shared draws
        self._epoch, self.pos = 0, 0
        self.acc = torch.zeros(self.width, dtype=self.dtype, device=self.device)  # (k,)
        self.order = torch.stack([self._first_order(s) for s in self.seeds])  # (L, m)
        self.keys = self._fresh_keys()  # (L, m)
        self.lane_index = torch.tensor(self.lanes, device=self.device)  # (L,)

    # --- DistributedOrdering hooks ---------------------------------------------------
    @property
    def local_order(self) -> torch.Tensor:
        return self.order

    @property
    def epoch(self) -> int:
        return self._epoch

    def _step(self, flat: torch.Tensor) -> None:
        rows = flat.shape[1]
        self._check_rows(rows)
        pairs = rows // 2
        local = self._local_vectors(flat[:, 0 : 2 * pairs].to(self.dtype))  # (L, P, k)
        gathered = self.comm.all_gather(local, name="cd_grab pair differences")  # (W, P, k)
        signs = self._balance(gathered).index_select(0, self.lane_index)  # (L, P)
        members = torch.stack([signs, -signs], dim=2).reshape(len(self.lanes), 2 * pairs)
        positions = torch.arange(self.pos, self.pos + 2 * pairs, device=self.device)  # (2P,)
        self.keys[:, self.pos : self.pos + 2 * pairs] = sign_keys(positions, members, self.m)
        if rows % 2:  # the epoch's unpaired last example joins the positives
            self.keys[:, self.pos + rows - 1] = self.pos + rows - 1
        self.pos += rows
        self.last_bytes_sent = pairs * self.width * self.acc.element_size()
        self.bytes_sent += self.last_bytes_sent

    def _set_epoch(self, epoch: int) -> None:
        while self._epoch < epoch:
            self._advance()

    # --- the coordinated balance -------------------------------------------------------
    def _local_vectors(self, grads: torch.Tensor) -> torch.Tensor:
        """``(L, 2P, d)`` gradients -> ``(L, P, k)`` pair differences (sketched if asked).

        Each worker's rows are processed alone, with exactly the operations a real rank
        runs, so the simulator sends bitwise the same values as ``W`` processes.
        """
        diffs = grads[:, 0::2] - grads[:, 1::2]  # (L, P, d)
        return torch.stack([self._prepare(diffs[lane]) for lane in range(diffs.shape[0])])

    def _prepare(self, diffs: torch.Tensor) -> torch.Tensor:
        """One worker's ``(P, d)`` differences -> ``(P, k)`` vectors to send."""
        if self.normalize:
            diffs = normalize_rows(diffs)
        return diffs if self.projection is None else self.projection(diffs)

    def _balance(self, gathered: torch.Tensor) -> torch.Tensor:
        """Sign all ``(W, P, k)`` gathered vectors pair-major; returns ``(W, P)`` signs."""
        workers, pairs, width = gathered.shape
        vectors = gathered.transpose(0, 1).reshape(pairs * workers, width)  # (P W, k)
        dots = vectors @ self.acc  # (P W,)
        thresholds = self.kernel.thresholds(len(dots), self.generator, self.dtype, self.device)
        signs = sequential_signs(dots, vectors @ vectors.T, thresholds)  # (P W,)
        self.acc.addmv_(vectors.T, signs)
        return signs.reshape(pairs, workers).T

    # --- epochs and state ---------------------------------------------------------------
    def _first_order(self, seed: int) -> torch.Tensor:
        generator = torch.Generator(device=self.device).manual_seed(seed)
        return torch.randperm(self.m, generator=generator, device=self.device)  # (m,)

    def _fresh_keys(self) -> torch.Tensor:
        keys = UNVISITED_KEY + torch.arange(self.m, device=self.device)  # (m,)
        return keys.expand(len(self.lanes), self.m).clone()  # (L, m)

    def _check_rows(self, rows: int) -> None:
        left = self.m - self.pos
        if rows > left:
            raise ValueError(
                f"step: got {rows} rows per worker but only {left} are left in epoch "
                f"{self._epoch}; call set_epoch({self._epoch + 1}) first"
            )
        if rows % 2 and rows != left:
            raise ValueError(f"cd_grab: the per-worker batch size must be even; got {rows}")

    def _advance(self) -> None:
        if self.pos < self.m:
            warnings.warn(
                f"cd_grab: {self.m - self.pos} of {self.m} examples per worker were not "
                f"stepped in epoch {self._epoch}; they keep their order after the balanced ones",
                UserWarning,
                stacklevel=4,
            )
        self.order = torch.gather(self.order, 1, torch.argsort(self.keys, dim=1, stable=True))
        self.keys = self._fresh_keys()
        self.acc.zero_()
        self._epoch, self.pos = self._epoch + 1, 0

    def state_bytes(self) -> int:
        """Bytes of the orders, keys and accumulator held by this process."""
        return sum(t.numel() * t.element_size() for t in (self.order, self.keys, self.acc))

    def state_dict(self) -> dict[str, Any]:
        return {
            "variant": self.name,
            "epoch": self._epoch,
            "pos": self.pos,
            "lanes": list(self.lanes),
            "order": self.order.clone(),
            "keys": self.keys.clone(),
            "acc": self.acc.clone(),
            "generator": self.generator.get_state().cpu(),
            "generator_device": self.generator.device.type,
            "bytes_sent": self.bytes_sent,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state["variant"] != self.name or list(state["lanes"]) != self.lanes:
            raise ValueError("cd_grab: the state is of another ordering or other workers")
        if state["generator_device"] != self.device.type:
            raise ValueError(
                f"cd_grab: the state's generator ran on {state['generator_device']}, this "
                f"one's on {self.device.type}; build it with device={state['generator_device']!r}"
            )
        self._epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self.order = state["order"].to(self.device)
        self.keys = state["keys"].to(self.device)
        self.acc = state["acc"].to(device=self.device, dtype=self.dtype)
        self.generator.set_state(state["generator"].cpu())
        self.bytes_sent = int(state["bytes_sent"])
