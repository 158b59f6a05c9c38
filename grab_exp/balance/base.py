"""The ``Ordering`` base class: epochs, positions, keys, next orders, checkpoints.

An ordering owns the order of the current epoch and is the ``torch.utils.data.Sampler`` over
it. Training steps hand it the per-sample gradients of the next ``B`` examples of that order;
the ordering records one sort key per visit position, and at the end of the epoch the next
order is the current one sorted by those keys.

An ordering that serves several data-parallel workers (:mod:`grab_exp.distributed`) keeps one
order per worker: ``order`` and ``keys`` are ``(*lanes, n)``, with ``lanes = ()`` for one
worker and ``(L,)`` for the ``L`` workers of a process. Everything here works on the last
dimension, so both share this code.

What only the orderings that read gradients need (a sign kernel, normalization, the balancing
state's dtype, a projection) is :class:`~grab_exp.balance.gradient.GradientOrdering`'s: an
ordering that reads none (``rr``, ``so``, ``fixed``) takes none of those options.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch.utils.data import Sampler

from grab_exp.balance.projection import BlockProjection, describe
from grab_exp.balance.signs import UNVISITED_KEY
from grab_exp.balance.tensors import IndexCheck, counting
from grab_exp.grads.batch import rows_of
from grab_exp.grads.rows import keep_views
from grab_exp.validation import check_choice, check_int_at_least

FIRST_EPOCH = ("random", "identity")


@dataclass(frozen=True)
class Work:
    """What a step cannot do without, from the shapes alone: the bytes it moves to or from
    memory and the floating-point operations it computes (:mod:`grab_exp.bench.limits` turns
    them into the step's time limit on a machine)."""

    bytes: int
    flops: int

    def __add__(self, other: Work) -> Work:
        return Work(self.bytes + other.bytes, self.flops + other.flops)


NO_WORK = Work(0, 0)


class Ordering(Sampler[int]):
    """Base class of every ordering: balance variants, gradient-free baselines, data-parallel.

    Args:
        n: number of examples (per worker, with lanes).
        d: length of one flattened per-sample gradient.
        seed: seed of the ordering's ``torch.Generator`` (first order, kernel draws).
        first_epoch: order of epoch 0, ``random`` (seeded) or ``identity``.
        device: device of the orders (and of a gradient ordering's balancing state).
        lanes: the leading shape of ``order`` and ``keys``: ``()`` or ``(L,)`` workers.
    """

    name: ClassVar[str] = ""
    needs_grads: ClassVar[bool] = False
    #: the sketch a gradient ordering balances with (none here: see ``GradientOrdering``)
    projection: BlockProjection | None = None
    #: reads factored gradients as factors (False: the ordering materializes them anyway)
    reads_factors: ClassVar[bool] = True
    #: serves data-parallel workers (``balance=`` with ``distributed=true``)
    distributed: ClassVar[bool] = False
    registry: ClassVar[dict[str, type[Ordering]]] = {}
    state_tensors: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__dict__.get("name"):  # its own name: a subclass (a test's variant) keeps out
            Ordering.registry[cls.name] = cls

    @classmethod
    def choices(cls, distributed: bool = False) -> dict[str, type[Ordering]]:
        """The registered orderings by name: single-process ones, or data-parallel ones."""
        return {n: c for n, c in Ordering.registry.items() if c.distributed == distributed}

    @classmethod
    def options(cls) -> set[str]:
        """The keyword options its constructor takes (those of every class it passes
        ``**kwargs`` on to included)."""
        names: set[str] = set()
        for klass in cls.__mro__:
            if "__init__" not in vars(klass) or klass in (Sampler, object):
                continue
            parameters = inspect.signature(vars(klass)["__init__"]).parameters.values()
            names |= {p.name for p in parameters if p.kind is p.KEYWORD_ONLY}
            if not any(p.kind is p.VAR_KEYWORD for p in parameters):
                break
        return names

    @classmethod
    def check_options(cls, options: Mapping[str, Any]) -> None:
        """Refuse an option the ordering does not take, in one line naming what it takes.

        Raises:
            ValueError: ``balance.<option>: ...; allowed: ...``.
        """
        allowed = cls.options()
        for key in options:
            if key not in allowed:
                why = " (it reads no gradients)" if not cls.needs_grads else ""
                raise ValueError(
                    f"balance.{key}: {cls.name or cls.__name__} takes no {key}{why}; allowed: "
                    f"{', '.join(sorted(allowed))}"
                )

    def __init__(
        self,
        n: int,
        d: int,
        *,
        seed: int = 0,
        first_epoch: str = "random",
        device: torch.device | str = "cpu",
        lanes: tuple[int, ...] = (),
    ) -> None:
        check_int_at_least("n", n, 1)
        check_int_at_least("d", d, 1)
        check_choice("balance.first_epoch", first_epoch, FIRST_EPOCH)
        self.n, self.d, self.lanes = n, d, tuple(lanes)
        self.device = torch.device(device)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.epoch = 0
        self.position = torch.zeros((), dtype=torch.long, device=self.device)  # next visit
        self._index_check = IndexCheck(self.device)
        self.order = self._first_order(first_epoch)  # (*lanes, n)
        self.keys = self._fresh_keys()  # (*lanes, n)
        self._init_state()
        for k in self.state_tensors:  # long-lived: their views are made once (see keep_views)
            setattr(self, k, keep_views(getattr(self, k)))

    # --- hooks for the orderings ----------------------------------------------------------
    def _init_state(self) -> None:
        """Allocate the ordering's state tensors (named in ``state_tensors``)."""

    def _take(self, grads: Any, positions: torch.Tensor) -> None:
        """Read one step's gradients for visit positions ``positions (B,)`` (device values: a
        step reads none on the host); an ordering that needs no gradients reads nothing."""

    def _end_epoch(self) -> None:
        """Finish the epoch's keys and reset per-epoch state (before the reorder)."""

    def _next_order(self) -> torch.Tensor:
        """The next epoch's order ``(*lanes, n)``: the current order sorted by the keys."""
        return self.order.gather(-1, torch.argsort(self.keys, dim=-1, stable=True))

    def _first_order(self, first_epoch: str) -> torch.Tensor:
        if first_epoch == "identity":
            return torch.arange(self.n, device=self.device)
        return self._random_order()

    def _dataset_indices(self, positions: torch.Tensor) -> torch.Tensor:
        """Dataset indices of ``order`` entries ``(*lanes, k)`` (the entries themselves here)."""
        return positions

    def _rows_per_lane(self, rows: int) -> int:
        """Rows of a step that belong to each lane (all of them without lanes)."""
        return rows

    # --- public API ---------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        """This epoch's dataset indices still to visit, in visit order (worker after worker, with
        lanes): the whole epoch at its start; after :meth:`load_state_dict` of a state saved
        mid-epoch, the rest of it, so a ``DataLoader`` over the ordering continues where the
        saved run stopped (as torch's stateful data loading does)."""
        return iter(self.visit_order[..., self.pos :].reshape(-1).tolist())

    def __len__(self) -> int:
        """Examples per epoch (per worker, with lanes)."""
        return self.n

    @property
    def visit_order(self) -> torch.Tensor:
        """``(*lanes, n)`` dataset indices in this epoch's visit order."""
        return self._dataset_indices(self.order)

    def index_batches(self, batch_size: int, drop_last: bool = False) -> Iterator[torch.Tensor]:
        """The current order as ``(*lanes, batch_size)`` index tensors on the ordering's device
        (the last may be shorter unless ``drop_last``)."""
        check_int_at_least("batch_size", batch_size, 1)
        order = self.visit_order
        stop = self.n - self.n % batch_size if drop_last else self.n
        for start in range(0, stop, batch_size):
            yield order[..., start : start + batch_size]

    def step(
        self,
        grads: torch.Tensor | Mapping[str, torch.Tensor] | None = None,
        indices: torch.Tensor | None = None,
    ) -> None:
        """Feed the per-sample gradients of the next ``B`` examples of the order.

        Args:
            grads: ``(B, d)`` (or ``(B, ...)``) tensor, or a dict of ``(B, ...)``
                tensors as returned by ``torch.func.vmap(grad(...))``, or the factored
                gradients of :mod:`grab_exp.per_sample`. With lanes, ``B = L * b`` rows,
                worker-major. Optional for gradient-free orderings.
            indices: optional ``(B,)`` dataset indices of these examples; they must
                be the next ones of the current order.

        Raises:
            ValueError: on a wrong row count or indices that are not the next ones.
        """
        rows = self._rows_per_lane(rows_of(grads, indices, self.needs_grads))
        positions = self._visit_positions(rows)  # (rows,)
        self._check_rows(rows, positions, indices)
        self._take(grads, positions)
        self.position += rows

    def set_epoch(self, epoch: int) -> None:
        """Advance to ``epoch`` (a no-op when it is the current one)."""
        check_int_at_least("epoch", epoch, self.epoch)
        while self.epoch < epoch:
            self._advance()

    @property
    def pos(self) -> int:
        """Visit positions stepped in this epoch (a host read of :attr:`position`: between
        steps, not inside one)."""
        return int(self.position)

    @pos.setter
    def pos(self, value: int) -> None:
        self.position.fill_(value)

    @property
    def takes_factors(self) -> bool:
        """Whether factored per-sample gradients save work here: the ordering reads them as
        factors (or reads none, as functional RR) and no sketch materializes them."""
        return self.reads_factors and self.projection is None

    @classmethod
    def capture_batch_sizes(cls, batch_size: int) -> str | None:
        """``None`` when every full batch of ``batch_size`` rows runs the same step (one captured
        graph serves them all), else the batch sizes that do, in words."""
        return None

    def prepare_capture(self) -> None:
        """Make what a captured step needs and must not make itself (before the capture)."""

    def work(self, rows: int) -> Work:
        """What one step of ``rows`` examples must do at least (:class:`Work`): an ordering that
        reads no gradients writes ``rows`` keys, which is nothing at this scale."""
        return NO_WORK

    def state_bytes(self) -> int:
        """Bytes held by the ordering's state (orders, keys, accumulators, ...)."""
        tensors = [self.order, self.keys, *(getattr(self, k) for k in self.state_tensors)]
        return sum(t.numel() * t.element_size() for t in tensors)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue bit-identically (see ``load_state_dict``)."""
        self._index_check.raise_if_bad()
        state = {
            **self._identity(),
            "epoch": self.epoch,
            "pos": self.pos,
            "order": self.order.clone(),
            "keys": self.keys.clone(),
            "generator": self.generator.get_state().cpu(),
            **{k: getattr(self, k).clone() for k in self.state_tensors},
        }
        state.update(self._extra_state())
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore a ``state_dict()`` of the same ordering, ``n``, ``d`` and projection.

        Raises:
            ValueError: one line naming what differs (or is missing from an older state).
        """
        for key, mine in self._identity().items():
            if key not in state:
                raise ValueError(
                    f"state_dict: has no {key!r} (written by an older grab-exp, whose "
                    f"{self.name} cannot continue here); start the run over"
                )
            if state[key] != mine:
                raise ValueError(f"state_dict: {key} is {state[key]!r}, this ordering has {mine!r}")
        for k in ("order", "keys", *self.state_tensors):  # all checked before anything changes
            if state[k].shape != getattr(self, k).shape:
                raise ValueError(
                    f"state_dict: {k} has shape {tuple(state[k].shape)}, this ordering's has "
                    f"{tuple(getattr(self, k).shape)}"
                )
        self.epoch, self.pos = int(state["epoch"]), int(state["pos"])
        self.order.copy_(state["order"])  # in place, as all state: a captured step holds them
        self.keys.copy_(state["keys"])
        self.generator.set_state(state["generator"].cpu())
        for k in self.state_tensors:
            getattr(self, k).copy_(state[k])  # in place: views stay views
        self._load_extra_state(state)

    # --- internals ------------------------------------------------------------------------
    def _identity(self) -> dict[str, Any]:
        """What a state_dict must match to load (the projection; the generator's device type)."""
        return {
            "variant": self.name,
            "n": self.n,
            "d": self.d,
            "projection": describe(self.projection),
            "generator_device": self.generator.device.type,
        }

    def _extra_state(self) -> dict[str, Any]:
        return {}

    def _load_extra_state(self, state: Mapping[str, Any]) -> None:
        """Restore the python values written by ``_extra_state``."""

    def _random_order(self) -> torch.Tensor:
        return torch.randperm(self.n, generator=self.generator, device=self.device)

    def _fresh_keys(self) -> torch.Tensor:
        keys = UNVISITED_KEY + torch.arange(self.n, device=self.device)  # (n,)
        return keys.expand(*self.lanes, self.n).clone()  # (*lanes, n)

    def _visit_positions(self, rows: int, back: int = 0) -> torch.Tensor:
        """``(rows,)`` visit positions on the device from ``back`` before the next one (past the
        epoch's end they stay on its last position: the step is refused, see
        :meth:`_check_rows`)."""
        start = self.position - back if back else self.position  # ()
        return torch.add(start, counting(rows, self.device)).clamp_(max=self.n - 1)

    def _check_rows(self, rows: int, positions: torch.Tensor, indices: torch.Tensor | None) -> None:
        """Refuse a step past the epoch's end, indices that are not the order's next ones, and
        what :meth:`_refuse_step` refuses: before the step changes anything where the host reads
        the device for free, else at the next ``raise_if_bad`` (no host read in a step)."""
        check = self._index_check
        check.refuse(torch.gt(self.position, self.n - rows), IndexCheck.OVERRUN)
        if indices is not None:
            expected = self._dataset_indices(self.order.index_select(-1, positions))
            check.add(indices, expected.reshape(-1))
        self._refuse_step(rows)
        check.raise_if_free()

    def _refuse_step(self, rows: int) -> None:
        """Count an ordering's own refusals of a step of ``rows`` rows (``IndexCheck.refuse``)."""

    def _advance(self) -> None:
        self._index_check.raise_if_bad()
        unstepped = self.n - self.pos
        if self.needs_grads and unstepped:
            per = " per worker" if self.lanes else ""
            warnings.warn(
                f"{self.name}: {unstepped} of {self.n} examples{per} were not stepped in epoch "
                f"{self.epoch}; they keep their relative order after the balanced ones",
                UserWarning,
                stacklevel=3,
            )
        self._end_epoch()
        self.order.copy_(self._next_order())  # in place: a captured step holds order and keys
        self.keys.copy_(self._fresh_keys())
        self.epoch += 1
        self.position.zero_()
