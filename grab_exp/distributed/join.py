"""Join a ``torch.distributed`` job: torchrun's (or SLURM's) variables, the backend, the GPU.

:func:`init_distributed` is how a rank of ``python -m grab_exp distributed=true`` joins its job;
it returns a :class:`~grab_exp.distributed.comm.ProcessGroupComm` and the rank's device.
"""

from __future__ import annotations

import atexit
import datetime as dt
import inspect
import os

import torch
import torch.distributed as dist

from grab_exp.distributed.comm import DEFAULT_TIMEOUT_S, ProcessGroupComm


def export_slurm_env() -> bool:
    """Set torchrun's variables from SLURM's in a SLURM task started without torchrun.

    Hydra's ``submitit_slurm`` launcher with ``tasks_per_node: W`` starts every task itself
    (``srun``); submitit's ``TorchDistributedEnvironment`` turns ``SLURM_PROCID``,
    ``SLURM_NTASKS``, ``SLURM_LOCALID`` and the node list into ``RANK``, ``WORLD_SIZE``,
    ``LOCAL_RANK``, ``MASTER_ADDR`` (first node) and ``MASTER_PORT`` (from the job id).

    Returns:
        Whether the variables were exported (``False`` when ``RANK`` is set or not in SLURM).
    """
    if "RANK" in os.environ or "SLURM_NTASKS" not in os.environ:
        return False
    from submitit.helpers import TorchDistributedEnvironment  # the `launchers` extra

    TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
    return True


def local_cuda_index(local_rank: int, count: int, visible: str | None) -> int:
    """The GPU of the process with ``LOCAL_RANK`` ``local_rank`` among ``count`` visible ones.

    Rank ``r`` takes ``cuda:r`` when the process sees all its node's GPUs; a process that sees
    exactly one GPU because its launcher gave it its own (``CUDA_VISIBLE_DEVICES`` names one)
    takes ``cuda:0``.

    Raises:
        ValueError: one line, when ``local_rank`` has no GPU of its own (two ranks on one GPU
            would make NCCL fail with "Duplicate GPU detected").
    """
    if local_rank < count:
        return local_rank
    if count == 1 and visible is not None and len(visible.split(",")) == 1:
        return 0
    raise ValueError(
        f"distributed: LOCAL_RANK={local_rank} has no GPU of its own (this process sees "
        f"{count}); allowed: at most {count} processes per node (torchrun "
        f"--nproc-per-node={count}), or distributed.backend=gloo"
    )


def rank_cuda_index(device: str, count: int, env: dict[str, str]) -> int:
    """The GPU a job with ``device`` (``cuda``, ``cuda:k`` or ``auto``) trains on: ``k`` when
    named, else its local rank's (:func:`local_cuda_index`, from ``LOCAL_RANK`` and
    ``CUDA_VISIBLE_DEVICES`` in ``env``; rank 0 alone).

    Args:
        device: The job's ``device`` setting.
        count: GPUs this process sees.
        env: The environment (``os.environ``).
    """
    if ":" in device:
        return torch.device(device).index
    return local_cuda_index(int(env.get("LOCAL_RANK", "0")), count, env.get("CUDA_VISIBLE_DEVICES"))


def init_distributed(
    backend: str = "auto", timeout_s: float = DEFAULT_TIMEOUT_S, device: str = "auto"
) -> tuple[ProcessGroupComm, torch.device]:
    """Join the job ``torchrun`` (or any env:// launcher, or SLURM) started, with a timeout.

    Reads ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``
    (exported from SLURM's variables first when they are absent, see
    :func:`export_slurm_env`). ``auto`` picks NCCL when ``device`` is ``cuda`` (or ``auto``
    with CUDA available), else gloo. NCCL gives every local rank its own GPU
    (:func:`local_cuda_index`) and makes it the current device.

    Args:
        backend: ``auto`` | ``gloo`` | ``nccl``.
        timeout_s: timeout of the rendezvous and of every collective, in seconds.
        device: the job's ``device`` setting (``auto`` | ``cpu`` | ``cuda``).

    Returns:
        ``(comm, device)``: this rank's communicator and its device.

    Raises:
        ValueError: NCCL without a GPU for this local rank.
    """
    export_slurm_env()
    cuda = torch.cuda.is_available() and device != "cpu"
    if backend == "auto":
        backend = "nccl" if cuda else "gloo"
    resolved = torch.device("cpu")
    kwargs = {}
    if backend == "nccl":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        resolved = torch.device("cuda", rank_cuda_index("cuda", count, dict(os.environ)))
        torch.cuda.set_device(resolved)
        if "device_id" in inspect.signature(dist.init_process_group).parameters:  # torch >= 2.3
            kwargs["device_id"] = resolved
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=dt.timedelta(seconds=timeout_s), **kwargs)
        # left to the interpreter's teardown, the group's threads can be destroyed unjoined
        # ("terminate called without an active exception": the rank dies with SIGABRT after
        # its job finished); every job of this process shares the group, so it goes at exit
        atexit.register(_destroy_group)
    return ProcessGroupComm(timeout_s), resolved


def _destroy_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
