"""What differs between a job in one process and one over data-parallel workers.

:func:`connect` picks the strategy from ``cfg.distributed``. The job lifecycle
(:mod:`grab_exp.runner.lifecycle`) and the epoch (:mod:`grab_exp.runner.epoch`) use only the
small interface of :class:`Strategy`: build the ordering, shard the batches, reduce gradients,
finish an epoch, evaluate, and move the ordering's state in and out of checkpoints.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig
from torch import nn

from grab_exp.runner.evaluate import evaluate
from grab_exp.runner.schema import ConfigError
from grab_exp.sampler import GraBSampler


def resolve_device(device: str) -> torch.device:
    """``auto`` -> ``cuda`` when available, else ``cpu``; others as given (checked by
    :func:`~grab_exp.runner.config_check.validate_config`). ``cuda:k`` becomes the current
    CUDA device (where kernels and CUDA generators without an index go)."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    resolved = torch.device(device)
    if resolved.type == "cuda" and resolved.index is not None:
        torch.cuda.set_device(resolved)
    return resolved


def set_cuda_policy(device: torch.device, tf32: bool) -> None:
    """On CUDA: deterministic cuDNN without autotuning, and TF32 only when asked for.

    TF32 rounds matmul and convolution inputs to 10 mantissa bits (cuDNN convolutions use it
    by default from Ampere on): per-sample gradients, and so sign decisions, would then
    differ from float32 by far more than rounding. ``trainer.tf32=false`` (the default)
    keeps float32; ``true`` trades that for speed. Nothing changes on the CPU.
    """
    if device.type != "cuda":
        return
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False
    # Both APIs agree: from torch 2.9 on, reading a legacy flag (Dynamo, Inductor and
    # get_float32_matmul_precision do) raises once it disagrees with the new settings. The
    # legacy setters first: they write the new settings too, cuDNN's as "none".
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    if hasattr(torch.backends.cudnn, "conv"):  # torch >= 2.9: the fp32_precision settings
        precision = "tf32" if tf32 else "ieee"
        torch.backends.cuda.matmul.fp32_precision = precision
        torch.backends.cudnn.conv.fp32_precision = precision
        torch.backends.cudnn.rnn.fp32_precision = precision


class Strategy:
    """One process training alone: a :class:`~grab_exp.sampler.GraBSampler` over all examples.

    Attributes:
        kind: ``single`` or ``data_parallel``; recorded in checkpoints.
        world_size: workers of the job (1 here).
        is_writer: whether this process writes metrics, checkpoints and W&B (rank 0).
        extra_columns: metric columns of this strategy beyond the common ones.
    """

    kind: ClassVar[str] = "single"
    extra_columns: ClassVar[tuple[str, ...]] = ()

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.world_size = 1
        self.is_writer = True

    def make_ordering(self, cfg: DictConfig, n: int, d: int) -> GraBSampler:
        """The run's ordering over ``n`` examples with ``d``-value gradients."""
        balance = instantiate(cfg.balance)(n=n, d=d, seed=cfg.seed, device=self.device)
        return GraBSampler(n, balance=balance)

    def index_batches(self, ordering: GraBSampler, batch_size: int) -> Iterator[torch.Tensor]:
        """The epoch's batches as ``(B,)`` index tensors on the device."""
        return ordering.index_batches(batch_size)

    def gradient_reducer(self, model: nn.Module) -> Callable[[], None] | None:
        """What averages ``param.grad`` over the workers after the backward (nothing here)."""
        return None

    def start_epoch(self, ordering: Any) -> None:
        """Note what :meth:`end_epoch` reports relative to the epoch's start."""

    def end_epoch(
        self, model: nn.Module, ordering: Any, loss_sum: torch.Tensor, steps: int
    ) -> dict[str, Any]:
        """The mean step loss (``train/running_loss``) and this strategy's extra columns."""
        return {"train/running_loss": loss_sum.item() / steps}

    def evaluate(
        self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int
    ) -> tuple[float, float]:
        """Mean loss and accuracy on a whole split."""
        loss, acc = evaluate(model, x, y, batch_size)
        return loss.item(), acc.item()

    def ordering_state(self, ordering: GraBSampler) -> Any:
        """The ordering's state for the checkpoint (collective in data-parallel jobs)."""
        return ordering.state_dict()

    def load_ordering_state(self, ordering: GraBSampler, state: dict[str, Any]) -> None:
        """Restore the ordering from a checkpoint written by a job of the same kind."""
        ordering.load_state_dict(state["ordering"])

    def barrier(self, name: str) -> None:
        """Wait for every worker (nothing to wait for here)."""

    def from_writer(self, value: Any, name: str) -> Any:
        """Rank 0's ``value`` on every worker (collective when data-parallel)."""
        return value

    def summary_fields(self) -> dict[str, Any]:
        """Fields of ``summary.json`` that only this kind of job has."""
        return {}

    def run_name(self, variant: str, pipeline: str, seed: int) -> str:
        """The W&B run's display name."""
        return f"{variant}-{pipeline}-seed{seed}"

    def log_start(self, ordering: Any) -> None:
        """Log what a reader should know before the first epoch."""


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


def connect(cfg: DictConfig) -> Strategy:
    """The strategy of ``cfg``: alone, simulated workers, or this process's torchrun rank."""
    options = cfg.distributed
    if options.enabled or options.simulate_workers:
        from grab_exp.runner.data_parallel import connect_data_parallel

        strategy = connect_data_parallel(cfg)
    else:
        strategy = Strategy(resolve_device(cfg.device))
    set_cuda_policy(strategy.device, cfg.trainer.tf32)
    return strategy
