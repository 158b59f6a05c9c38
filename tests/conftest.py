"""Shared test set-up: ``gpu``-marked tests skip without CUDA; no test leaves a W&B service
behind; compose and CLI fixtures.

Pytest puts this file's folder, ``tests/``, on ``sys.path`` (the default ``prepend`` import
mode), so every test imports the support package as ``support``: ``support.grab_run`` (compose
the config, run ``python -m grab_exp``, build its jobs), ``support.run_files`` (read what a run
wrote), ``support.wandb_reader`` (read an offline W&B run back), ``support.helpers`` and
``support.reference_orderings`` (the orderings' tests), ``support.sync_guard`` (the CPU sync
check), ``support.layer_harness`` and ``support.client_models`` (the per-sample tests) and
``support.distributed_worker`` (one gloo rank, run as a script).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from omegaconf import DictConfig
from support.grab_run import (
    RUN_TIMEOUT_S,
    WANDB_SERVICE,
    compose_config,
    grab_env,
    run_grab,
    run_in_process,
    wandb_teardown,
)


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="CUDA is not available")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _no_wandb_service_left() -> Iterator[None]:
    """A test that started W&B in this process (a logger, the report's upload) ends its service,
    and the ``WANDB_SERVICE`` it set goes: else a later in-process run would end the service
    and put the variable back, and a subprocess that inherits it would connect to a service that
    is gone and log nothing to W&B."""
    before = os.environ.get(WANDB_SERVICE)
    yield
    if os.environ.get(WANDB_SERVICE) != before:
        wandb_teardown()


@pytest.fixture
def compose() -> Callable[..., DictConfig]:
    """``compose(overrides, hydra=False)``: the config ``python -m grab_exp`` would run."""
    return compose_config


@pytest.fixture
def smoke_config() -> DictConfig:
    """The composed ``experiment=smoke`` config (synthetic data, LeNet, mean balance)."""
    return compose_config(["experiment=smoke"])


@pytest.fixture
def grab(tmp_path: Path) -> Callable[..., object]:
    """``grab(args, timeout=..., **env)``: ``python -m grab_exp *args`` run in ``tmp_path`` (its
    ``outputs/`` land there) with W&B offline inside it; stdout and stderr merged."""

    def run(args: list[str], timeout: float = RUN_TIMEOUT_S, **env: str):
        return run_grab(args, tmp_path, grab_env(tmp_path, **env), timeout)

    return run


@pytest.fixture
def grab_here(tmp_path: Path) -> Callable[..., object]:
    """``grab_here(args, **env)``: the ``grab`` fixture's run, in this process
    (:func:`~support.grab_run.run_in_process`)."""

    def run(args: list[str], **env: str):
        return run_in_process(args, tmp_path, grab_env(tmp_path, **env))

    return run
