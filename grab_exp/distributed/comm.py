"""Communication for the distributed orderings and data-parallel training.

Two communicators give the same CD-GraB code two backends:

* :class:`ProcessGroupComm`: one rank of a real ``torch.distributed`` job (gloo on CPU,
  NCCL on GPU), launched by ``torchrun``; it owns one worker (``local_ranks == (rank,)``).
* :data:`SimulatedComm` (the :class:`Communicator` itself): ``W`` virtual workers inside one
  process; it owns all of them (``local_ranks == (0, ..., W-1)``) and the all-gather is the
  stack of their tensors.

Every collective of :class:`ProcessGroupComm` runs under the process group's timeout and
turns a backend failure (a dead or hung peer) into a :class:`CollectiveError` that names the
rank, the collective and the timeout.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from typing import NoReturn, TypeVar

import torch
import torch.distributed as dist

from grab_exp.validation import check_int_at_least

T = TypeVar("T")
DEFAULT_TIMEOUT_S = 300.0


class CollectiveError(RuntimeError):
    """A collective failed or timed out: another rank probably died or hangs."""


class Communicator:
    """What the orderings and the trainer need from the workers' transport; itself the
    simulator (:data:`SimulatedComm`): ``W`` virtual workers in one process, gathering is
    stacking.

    Args:
        world_size: number of virtual workers ``W``.

    Attributes:
        world_size: number of workers ``W``.
        rank: this process's rank (0 in the simulator).
        local_ranks: the workers this process runs, in the row order of ``all_gather``'s input.
        processes: number of processes (``W`` for a process group, 1 for the simulator).
    """

    processes: int = 1

    def __init__(self, world_size: int = 1) -> None:
        check_int_at_least("simulate_workers", world_size, 1)
        self.world_size, self.rank = world_size, 0
        self.local_ranks = tuple(range(world_size))

    def all_gather(self, local: torch.Tensor, name: str = "all_gather") -> torch.Tensor:
        """Gather every worker's tensor.

        Args:
            local: ``(L, *shape)``, one row per local worker (``L = len(local_ranks)``).
            name: what is gathered (for error messages).

        Returns:
            ``(W, *shape)``, row ``r`` from worker ``r``.
        """
        if local.shape[0] != self.world_size:
            raise ValueError(
                f"{name}: got {local.shape[0]} rows; the simulator has {self.world_size}"
            )
        return local

    def all_reduce_sum_(self, tensor: torch.Tensor, name: str = "all_reduce") -> torch.Tensor:
        """Sum ``tensor`` over the processes, in place, and return it (in one process it is
        the sum: its one model already averages over its workers)."""
        return tensor

    def all_reduce_mean_(self, tensor: torch.Tensor, name: str = "all_reduce") -> torch.Tensor:
        """Average ``tensor`` over the processes, in place, and return it."""
        return self.all_reduce_sum_(tensor, name).div_(self.processes)

    def gather_objects(self, obj: object, name: str = "all_gather_object") -> list:
        """Every process's (picklable) ``obj``, in rank order (``[obj]`` in one process)."""
        return [obj]

    def barrier(self, name: str = "barrier") -> None:
        """Wait for every process (a no-op in one process)."""


#: ``W`` virtual workers in one process: the :class:`Communicator` itself
SimulatedComm = Communicator


class ProcessGroupComm(Communicator):
    """One rank of an initialized ``torch.distributed`` process group.

    Args:
        timeout_s: the group's collective timeout (used in error messages).
        group: the process group; ``None`` is the default group.
    """

    def __init__(self, timeout_s: float = DEFAULT_TIMEOUT_S, group=None) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "ProcessGroupComm: call init_distributed() (or init_process_group) first"
            )
        self.group, self.timeout_s = group, float(timeout_s)
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.local_ranks = (self.rank,)
        self.processes = self.world_size

    def all_gather(self, local: torch.Tensor, name: str = "all_gather") -> torch.Tensor:
        local = local.contiguous()
        out = local.new_empty((self.world_size, *local.shape[1:]))  # (W, *shape)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        self._run(name, lambda: gather(out, local, group=self.group))
        return out

    def all_reduce_sum_(self, tensor: torch.Tensor, name: str = "all_reduce") -> torch.Tensor:
        self._run(name, lambda: dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=self.group))
        return tensor

    def gather_objects(self, obj: object, name: str = "all_gather_object") -> list:
        """Every rank's ``obj`` with its tensors moved to the CPU first: a CUDA tensor would
        unpickle on the receiver as ``cuda:<sender's index>``, a device it may not see."""
        out: list = [None] * self.world_size
        local = cpu_tensors(obj)
        self._run(name, lambda: dist.all_gather_object(out, local, group=self.group))
        return out

    def barrier(self, name: str = "barrier") -> None:
        self._run(name, lambda: dist.barrier(group=self.group))

    def _run(self, name: str, collective: Callable[[], T]) -> T:
        try:
            return collective()
        except RuntimeError as error:  # DistBackendError, gloo/NCCL timeouts, closed sockets
            cause = (str(error).strip().splitlines() or [repr(error)])[0]
            raise CollectiveError(
                f"rank {self.rank}/{self.world_size}: collective {name!r} failed (timeout "
                f"{self.timeout_s:g} s); another rank probably died or hangs, so this rank "
                f"stops too. Cause: {cause}"
            ) from error


def cpu_tensors(obj: T) -> T:
    """``obj`` with every tensor in its nested dicts, lists and tuples on the CPU."""
    if isinstance(obj, torch.Tensor):
        return obj.cpu()
    if isinstance(obj, dict):
        return {key: cpu_tensors(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_tensors(value) for value in obj)
    return obj


def exit_after_collective_error(error: CollectiveError) -> NoReturn:
    """Print ``error: <message>`` to stderr and end the process with status 1, at once.

    A normal interpreter exit would tear down the broken process group's background threads,
    which can abort the process (``terminate called without an active exception``, status
    -6) after the message; ``os._exit`` skips that teardown.
    """
    print(f"error: {error}", file=sys.stderr, flush=True)
    sys.stdout.flush()
    os._exit(1)


def end_finished_rank() -> None:
    """End a torch.distributed rank whose job finished, with status 0, at once.

    Its group's background threads sometimes abort the interpreter's teardown, even with the
    group destroyed at exit (``terminate called without an active exception``, status -6);
    everything the job writes is closed by then. Any other process returns.
    """
    if dist.is_available() and dist.is_initialized():
        end_process(0)


def end_process(code: int) -> NoReturn:
    """End the process with status ``code`` after its message was printed.

    A torch.distributed rank ends at once (``os._exit``), for the reason given in
    :func:`exit_after_collective_error`: its peers may already be gone. Any other process
    raises ``SystemExit`` as usual.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    if dist.is_available() and dist.is_initialized():
        os._exit(code)
    raise SystemExit(code)
