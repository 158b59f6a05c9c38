"""The data-parallel strategy: W workers, real (torchrun, one per process) or simulated.

Every rank composes the same config, so all agree on the run directory; rank 0 alone writes
``metrics.csv``, ``summary.json``, the checkpoint (with every worker's ordering state) and the
W&B run. Each worker owns a seeded shard of ``n // W`` examples; a step feeds every local
worker's mini-batch (worker-major, ``(L * B,)`` indices) through the same training step, then
averages the mean gradient over the processes. A resumed job needs the same number of workers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import torch
from omegaconf import DictConfig
from torch import nn

from grab_exp.devices import resolve_device
from grab_exp.distributed.comm import Communicator, SimulatedComm
from grab_exp.distributed.join import init_distributed
from grab_exp.distributed.orderings import DistributedOrdering
from grab_exp.distributed.shards import split_shards
from grab_exp.distributed.sync import average_gradients_, check_identical_models, evaluate_shared
from grab_exp.models.evaluate import Total
from grab_exp.runner.config.schema import ConfigError
from grab_exp.runner.training.strategy import OrderingFactory, Strategy, restore_ordering

log = logging.getLogger("grab_exp")


class DataParallel(Strategy):
    """This process's share of a data-parallel job over ``comm``.

    Args:
        comm: the communicator (:class:`SimulatedComm` or a torch.distributed one).
        device: this rank's device.
        simulated: whether the workers are simulated in this one process.
    """

    kind = "data_parallel"
    extra_columns = ("comm/bytes_per_step", "comm/bytes_epoch", "check/param_checksum")

    def __init__(self, comm: Communicator, device: torch.device, simulated: bool) -> None:
        self.device, self.comm, self.simulated = device, comm, simulated
        self.world_size = comm.world_size
        self.is_writer = comm.rank == 0
        self.dropped = 0
        self._sent_before = 0

    def make_ordering(
        self, factory: OrderingFactory, n: int, d: int, seed: int
    ) -> DistributedOrdering:
        split = split_shards(n, self.world_size, seed)
        self.dropped = split.num_dropped
        return factory(shards=split.shards, d=d, comm=self.comm, seed=seed, device=self.device)

    def index_batches(
        self, ordering: DistributedOrdering, batch_size: int
    ) -> Iterator[torch.Tensor]:
        for batch in ordering.index_batches(batch_size):  # (L, B)
            yield batch.reshape(-1)  # (L * B,) worker-major

    def gradient_reducer(self, model: nn.Module) -> Callable[[], None] | None:
        if self.comm.processes == 1:
            return None
        return partial(average_gradients_, model, self.comm)

    def start_epoch(self, ordering: DistributedOrdering) -> None:
        self._sent_before = ordering.bytes_sent

    def end_epoch(
        self, model: nn.Module, ordering: DistributedOrdering, loss_sum: torch.Tensor, steps: int
    ) -> dict[str, Any]:
        steps = max(steps, 1)
        running = self.comm.all_reduce_mean_(loss_sum.double() / steps, name="loss")
        checksum = check_identical_models(model, self.comm)
        sent = ordering.bytes_sent - self._sent_before
        return {
            "train/running_loss": running.item(),
            "comm/bytes_per_step": sent / steps,
            "comm/bytes_epoch": sent,
            "check/param_checksum": checksum[2].item(),
        }

    def evaluate(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, total: Total
    ) -> tuple[float, float]:
        return evaluate_shared(model, x, y, batch_size, self.comm, total)

    def ordering_state(self, ordering: DistributedOrdering) -> list[dict[str, Any]]:
        return self.comm.gather_objects(ordering.state_dict(), name="ordering states")

    def load_ordering_state(self, ordering: DistributedOrdering, state: dict[str, Any]) -> None:
        restore_ordering(ordering, state["ordering"][self.comm.rank])

    def barrier(self, name: str) -> None:
        self.comm.barrier(name=name)

    def from_writer(self, value: Any, name: str) -> Any:
        return self.comm.gather_objects(value, name=name)[0]

    def summary_fields(self) -> dict[str, Any]:
        return {
            "world_size": self.world_size,
            "dropped_examples": self.dropped,
            "simulated": self.simulated,
        }

    def run_name(self, variant: str, pipeline: str, seed: int) -> str:
        return f"{variant}-w{self.world_size}-seed{seed}"

    def log_start(self, ordering: DistributedOrdering) -> None:
        if self.is_writer:
            log.info(
                "%d workers, %d examples each, %d dropped",
                self.world_size,
                ordering.m,
                self.dropped,
            )


def connect_data_parallel(cfg: DictConfig) -> DataParallel:
    """Simulated workers, or join the job torchrun (or SLURM) started; checks the world size."""
    options = cfg.distributed
    if options.simulate_workers:
        comm = SimulatedComm(options.simulate_workers)
        return DataParallel(comm, resolve_device(cfg.device), simulated=True)
    try:
        comm, device = init_distributed(options.backend, options.timeout_s, cfg.device)
    except ValueError as error:  # a local rank without a GPU of its own
        raise ConfigError(str(error)) from error
    if options.workers is not None and options.workers != comm.world_size:
        raise ConfigError(
            f"distributed.workers: got {options.workers}; torchrun started "
            f"{comm.world_size} processes"
        )
    return DataParallel(comm, device, simulated=False)
