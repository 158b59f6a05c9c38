"""Host-device synchronization on CUDA: never inside an ordering's step(), never inside a whole
training step, for every ordering, kernel and single-process config.

The orderings' step() alone is checked with every kernel and option. Then the runner's real jobs
(Hydra-composed config, LeNet, synthetic CIFAR-shaped data on the device) train one epoch to
warm up (allocator, cuDNN, compilation), then a whole epoch of ``train_steps`` - batch indexing,
per-sample gradients, the GSNR, the ordering's step, the optimizer step, the progress display -
with every host-device synchronization an error: on CUDA under
``torch.cuda.set_sync_debug_mode("error")``, on the CPU (so in CI) under
:class:`~support.sync_guard.SyncGuard`, which refuses the operators that synchronize on CUDA.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import pytest
import torch
from hydra.utils import get_class
from omegaconf import OmegaConf
from support.grab_run import CONF_DIR, compose_job, train_epochs
from support.helpers import ALL_ORDERINGS, KERNELS, make
from support.sync_guard import SyncGuard

from grab_exp.balance import Ordering
from grab_exp.runner.training.epoch import train_steps
from grab_exp.runner.training.progress import Progress

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@contextmanager
def no_host_sync(device: str, host_tensors: Iterable[torch.Tensor] = ()) -> Iterator[None]:
    """Every host-device synchronization in the block raises: on CUDA the sync debug mode's
    error, on the CPU :class:`~support.sync_guard.HostSyncError` (``host_tensors``: see
    SyncGuard)."""
    if device == "cpu":
        with SyncGuard(host_tensors):
            yield
        return
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


def _host_tensors(balance: Ordering, optimizer: torch.optim.Optimizer | None = None) -> list:
    """What a CPU run reads on the host by design: the balance's index check counter (checked
    at once on the CPU, deferred on CUDA) and torch's optimizer step counts (host tensors on
    every device)."""
    states = optimizer.state.values() if optimizer is not None else ()
    steps = [s["step"] for s in states if isinstance(s.get("step"), torch.Tensor)]
    return [balance._index_check.counts, *steps]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_ORDERINGS)
def test_step_is_sync_free(name, kernel, normalize, device):
    n, d, b = 70, 33, 8  # b does not divide n: the last step is a short one
    bal = make(name, n, d, batch_size=b, depth=3, kernel=kernel, normalize=normalize,
               device=device)  # fmt: skip
    g = torch.Generator(device=device).manual_seed(0)
    z = torch.randn(n, d, device=device, generator=g)
    for epoch in range(2):
        order = bal.order.clone()
        batches = [z[order[s : s + b]] for s in range(0, n, b)]  # indexing happens outside
        dicts = [{"w": x[:, :30].reshape(-1, 5, 6), "b": x[:, 30:]} for x in batches]
        with no_host_sync(device, _host_tensors(bal)):
            for i, x in enumerate(batches):
                bal.step(dicts[i] if epoch == 1 else x)
        bal.set_epoch(epoch + 1)
        assert sorted(bal.order.tolist()) == list(range(n))


# 100 = 6 * 16 + 4: the epoch ends with a short batch (and its own compiled graph)
RUN = ("dataset.num_train=100", "batch_size=16", "model=lenet")
#: the per-sample check off: it reads on the host by design, on the CPU at every call (a read is
#: free there), on CUDA on its checked calls (docs/which-models-work.md)
UNCHECKED = ("pipeline.check_every=0",)
OPTIMIZERS = ("sgd", "adam", "vr_sgd", "vr_momentum", "vr_adam")
VR = {"vr_sgd", "vr_momentum", "vr_adam"}
COUNTSKETCH = ("balance.projection_kind=countsketch",)


def _single_process_balances() -> list[tuple[str, bool]]:
    """``(option, needs_grads)`` of every conf/balance option that is a one-process ordering."""
    found = []
    for path in sorted((CONF_DIR / "balance").glob("*.yaml")):
        cls = get_class(OmegaConf.load(path)._target_)
        if isinstance(cls, type) and issubclass(cls, Ordering) and not cls.distributed:
            found.append((path.stem, cls.needs_grads))
    return found


def _cases() -> list[tuple[str, ...]]:
    cases = []
    for balance, needs_grads in _single_process_balances():
        for optimizer in OPTIMIZERS:
            for method in ("hooks", "factored", "func"):
                cases.append(
                    (f"balance={balance}", f"optimizer={optimizer}", f"pipeline.method={method}")
                )
            if not needs_grads and optimizer not in VR:
                cases.append((f"balance={balance}", f"optimizer={optimizer}", "pipeline=classic"))
    cases += [  # trainer.compile (default mode): the compiled graphs run sync-free too
        ("balance=rr", "optimizer=sgd", "pipeline=classic", "trainer.compile=true"),
        ("balance=mean", "optimizer=sgd", "trainer.compile=true"),
        ("balance=pair", "optimizer=vr_adam", "trainer.compile=true"),
    ]
    cases += [  # a sketched ordering draws its projection inside the step
        ("balance=mean", "optimizer=sgd", "balance.projection_dim=64"),
        ("balance=pair", "optimizer=sgd", "balance.projection_dim=64", *COUNTSKETCH),
    ]
    return cases


@pytest.mark.parametrize("device", DEVICES)
def test_the_check_catches_a_sync(device):
    value = torch.ones((), device=device)
    with pytest.raises(RuntimeError, match="synchroniz"), no_host_sync(device):
        value.item()


def _on_the_cpu(overrides: tuple[str, ...]) -> bool:
    """The CPU (CI) cases: every ordering and method with SGD, every optimizer with pair (the
    optimizer's step does not depend on the ordering); no compiled case (a dispatch mode sees
    no operator inside a compiled kernel)."""
    if "trainer.compile=true" in overrides:
        return False
    return "optimizer=sgd" in overrides or "balance=pair" in overrides


def _device_cases() -> list:
    cases = []
    for overrides in _cases():
        name = "-".join(overrides)
        if _on_the_cpu(overrides):
            cases.append(pytest.param(overrides, "cpu", id=f"cpu-{name}"))
        cases.append(pytest.param(overrides, "cuda", id=f"cuda-{name}", marks=pytest.mark.gpu))
    return cases


@pytest.mark.parametrize(("overrides", "device"), _device_cases())
def test_training_steps_are_sync_free(overrides, device):
    per_sample = "pipeline=classic" not in overrides
    job = compose_job([*RUN, *overrides, *(UNCHECKED if per_sample else ())], device=device)
    train_epochs(job, 1)  # warm-up: cuDNN plans, the caching allocator, compiled graphs
    job.parts.ordering.set_epoch(1)  # once per epoch: may read the deferred index check on the host
    with no_host_sync(device, _host_tensors(job.parts.ordering, job.parts.optimizer)):
        loss_sum, _ = train_steps(job, Progress("none"))
    assert torch.isfinite(loss_sum).item()
    job.parts.ordering.set_epoch(2)  # the epoch's steps were all valid (the deferred index check)
    assert sorted(job.parts.ordering.order.tolist()) == list(range(100))
