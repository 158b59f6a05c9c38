"""What differs between a job in one process and one over data-parallel workers.

:class:`Strategy` is one process alone, :mod:`grab_exp.runner.training.data_parallel` the
workers; :func:`~grab_exp.runner.training.connect.connect` picks one.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from grab_exp.balance import Ordering
from grab_exp.models.evaluate import Total, evaluate
from grab_exp.runner.config.schema import ConfigError

#: ``(n=, d=, seed=, device=, ...) -> Ordering``: the ``balance`` config, instantiated
OrderingFactory = Callable[..., Ordering]


class Strategy:
    """How a job spreads over processes; this base is one process training alone on ``device``.

    The job and its epochs use only this small interface: build the ordering, shard the
    batches, reduce gradients, finish an epoch, evaluate, and move the ordering's state in and
    out of checkpoints. :class:`~grab_exp.runner.training.data_parallel.DataParallel` overrides
    it for data-parallel workers.

    Args:
        device: the device the job trains on.

    Attributes:
        kind: ``single`` or ``data_parallel``; recorded in checkpoints.
        device: this process's device.
        world_size: workers of the job.
        is_writer: whether this process writes metrics, checkpoints and W&B (rank 0).
        extra_columns: metric columns of this strategy beyond the common ones.
    """

    kind: ClassVar[str] = "single"
    extra_columns: ClassVar[tuple[str, ...]] = ()

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.world_size = 1
        self.is_writer = True

    def make_ordering(self, factory: OrderingFactory, n: int, d: int, seed: int) -> Ordering:
        """The run's ordering over ``n`` examples with ``d``-value gradients."""
        return factory(n=n, d=d, seed=seed, device=self.device)

    def index_batches(self, ordering: Ordering, batch_size: int) -> Iterator[torch.Tensor]:
        """The epoch's batches as ``(B,)`` index tensors on the device (worker-major)."""
        return ordering.index_batches(batch_size)

    def gradient_reducer(self, model: nn.Module) -> Callable[[], None] | None:
        """What averages ``param.grad`` over the workers after the backward, if anything."""
        return None

    def start_epoch(self, ordering: Ordering) -> None:
        """Note what :meth:`end_epoch` reports relative to the epoch's start."""

    def end_epoch(
        self, model: nn.Module, ordering: Ordering, loss_sum: torch.Tensor, steps: int
    ) -> dict[str, Any]:
        """The mean step loss (``train/running_loss``) and this strategy's extra columns."""
        return {"train/running_loss": loss_sum.item() / steps}

    def evaluate(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int, total: Total
    ) -> tuple[float, float]:
        """Mean loss and accuracy on a whole split (``total``: the loss summed over a batch)."""
        loss, acc = evaluate(model, x, y, batch_size, total)
        return loss.item(), acc.item()

    def ordering_state(self, ordering: Ordering) -> Any:
        """The ordering's state for the checkpoint (collective in data-parallel jobs)."""
        return ordering.state_dict()

    def load_ordering_state(self, ordering: Ordering, state: dict[str, Any]) -> None:
        """Restore the ordering from a checkpoint written by a job of the same kind."""
        restore_ordering(ordering, state["ordering"])

    def barrier(self, name: str) -> None:
        """Wait for every worker."""

    def from_writer(self, value: Any, name: str) -> Any:
        """Rank 0's ``value`` on every worker."""
        return value

    def summary_fields(self) -> dict[str, Any]:
        """Fields of ``summary.json`` that only this kind of job has."""
        return {}

    def run_name(self, variant: str, pipeline: str, seed: int) -> str:
        """The W&B run's display name."""
        return f"{variant}-{pipeline}-seed{seed}"

    def log_start(self, ordering: Ordering) -> None:
        """Log what a reader should know before the first epoch."""


def restore_ordering(ordering: Ordering, state: dict[str, Any]) -> None:
    """``ordering.load_state_dict(state)``, its refusal as the checkpoint's one-line error."""
    try:
        ordering.load_state_dict(state)
    except ValueError as error:
        raise ConfigError(
            f"checkpoint.pt: {error}; resume with the settings that wrote it, or "
            "overwrite=true to start over"
        ) from error


def check_checkpoint_kind(strategy: Strategy, state: dict[str, Any]) -> None:
    """Refuse a checkpoint of another kind of job, of another number of workers, or written on
    another device type (CPU and CUDA generators differ: the orders could not continue)."""
    if state["device_type"] != strategy.device.type:
        raise ConfigError(
            f"device: the checkpoint was written on {state['device_type']}, this job runs on "
            f"{strategy.device.type}; resume with device={state['device_type']}, or "
            "overwrite=true to start over"
        )
    if state["strategy"] != strategy.kind:
        raise ConfigError(
            f"checkpoint.pt: written by a {state['strategy']} job, this job is "
            f"{strategy.kind}; resume it with the same distributed settings, or overwrite=true"
        )
    if state["world_size"] != strategy.world_size:
        raise ConfigError(
            f"distributed: the checkpoint has {state['world_size']} workers, this "
            f"job {strategy.world_size}; resume with the same number"
        )
