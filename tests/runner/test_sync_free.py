"""Host-device synchronization on CUDA: never inside an ordering's step(), never inside a whole
training step, for every ordering, kernel and single-process config.

The orderings' step() alone is checked with every kernel and option. Then the runner's real jobs
(Hydra-composed config, LeNet, synthetic CIFAR-shaped data on the GPU) train one epoch to warm up
(allocator, cuDNN, compilation), then a whole epoch of ``train_steps`` - batch indexing,
per-sample gradients, the GSNR, the ordering's step, the optimizer step, the progress display -
under ``torch.cuda.set_sync_debug_mode("error")``, which turns every host-device
synchronization into an error.
"""

from __future__ import annotations

import pytest
import torch
from grab_run import CONF_DIR, compose_job, train_epochs
from helpers import ALL_ORDERINGS, KERNELS, make
from hydra.utils import get_class
from omegaconf import OmegaConf

from grab_exp.balance import Ordering
from grab_exp.runner.epoch import train_steps
from grab_exp.runner.progress import Progress

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("normalize", [False, True])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_ORDERINGS)
def test_step_is_sync_free_on_cuda(name, kernel, normalize):
    n, d, b = 70, 33, 8  # b does not divide n: the last step is a short one
    bal = make(name, n, d, batch_size=b, depth=3, kernel=kernel, normalize=normalize,
               device="cuda")  # fmt: skip
    g = torch.Generator(device="cuda").manual_seed(0)
    z = torch.randn(n, d, device="cuda", generator=g)
    for epoch in range(2):
        order = bal.order.clone()
        batches = [z[order[s : s + b]] for s in range(0, n, b)]  # indexing happens outside
        dicts = [{"w": x[:, :30].reshape(-1, 5, 6), "b": x[:, 30:]} for x in batches]
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for i, x in enumerate(batches):
                bal.step(dicts[i] if epoch == 1 else x)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        bal.set_epoch(epoch + 1)
        assert sorted(bal.order.tolist()) == list(range(n))


# 100 = 6 * 16 + 4: the epoch ends with a short batch (and its own compiled graph)
RUN = ("dataset.num_train=100", "batch_size=16", "model=lenet")
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


def test_sync_debug_mode_catches_a_sync():
    value = torch.ones((), device="cuda")
    torch.cuda.set_sync_debug_mode("error")
    try:
        with pytest.raises(RuntimeError, match="synchroniz"):
            value.item()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("overrides", _cases(), ids="-".join)
def test_training_steps_are_sync_free(overrides):
    job = compose_job([*RUN, *overrides], device="cuda")
    train_epochs(job, 1)  # warm-up: cuDNN plans, the caching allocator, compiled graphs
    job.parts.ordering.set_epoch(1)  # once per epoch: may read the deferred index check on the host
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        loss_sum = train_steps(job, Progress("none"))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert torch.isfinite(loss_sum).item()
    job.parts.ordering.set_epoch(2)  # the epoch's steps were all valid (the deferred index check)
    assert sorted(job.parts.ordering.order.tolist()) == list(range(100))
