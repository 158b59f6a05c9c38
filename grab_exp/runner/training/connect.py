"""The job's strategy from ``cfg.distributed``: alone, simulated workers, or a torchrun rank."""

from __future__ import annotations

from omegaconf import DictConfig

from grab_exp.devices import resolve_device, set_cuda_policy
from grab_exp.runner.training.data_parallel import connect_data_parallel
from grab_exp.runner.training.strategy import Strategy


def connect(cfg: DictConfig) -> Strategy:
    """The strategy of ``cfg``, with CUDA's numerics policy set for its device."""
    options = cfg.distributed
    if options.enabled or options.simulate_workers:
        strategy = connect_data_parallel(cfg)
    else:
        strategy = Strategy(resolve_device(cfg.device))
    set_cuda_policy(strategy.device, cfg.trainer.tf32)
    return strategy
