"""A captured training step equals eager training: the CPU's proof for CUDA graphs.

:class:`~grab_exp.trace.TracedStep` records one whole ``train_step`` (forward, backward,
per-sample gradients, GSNR, ordering, optimizer) operator by operator and replays it with the first
step's Python values baked in, as a CUDA graph does. Each configuration trains two epochs eagerly
and two through :func:`~grab_exp.runner.training.capture.capture_step` (an eager warm-up step, the
traced step, replays for the rest of the first epoch and all of the second; the short last batch of
201 examples eagerly) and must end bit for bit where eager training ends: every step's loss, the
orders, keys and ordering state, the model, the optimizer. A step that read a host value that
changes between steps (a position, a pending flag) would replay the first step's.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from support.grab_run import compose_job, train_epochs
from support.helpers import BALANCES, GRADIENT_FREE, KERNELS

from grab_exp.runner.config.fingerprint import config_fingerprint
from grab_exp.runner.rundir.resolvers import settings_hash
from grab_exp.runner.training.capture import capture_step, make_capturable, register_generators
from grab_exp.runner.training.job import _restore, _save
from grab_exp.trace import TracedStep

EPOCHS = 2
SIZE = ("dataset.num_train=201",)  # 12 full batches of 16, then one of 9 (run eagerly)
PROJECTIONS = {"mean": "rademacher", "pair": "countsketch", "recursive": "gaussian"}
CONFIGS = {
    **{f"{name}-{pipe}": [f"balance={name}", f"pipeline={pipe}"]
       for name in GRADIENT_FREE for pipe in ("classic", "functional")},
    **{f"{name}-{kernel}": [f"balance={name}", f"balance.kernel={kernel}"]
       for name in BALANCES for kernel in KERNELS},
    **{f"{name}-normalize": [f"balance={name}", "balance.normalize=true"] for name in BALANCES},
    **{f"{name}-{kind}": [f"balance={name}", "balance.projection_dim=32",
                          f"balance.projection_kind={kind}"]
       for name, kind in PROJECTIONS.items()},
    **{f"mean-{method}": ["balance=mean", f"pipeline.method={method}"]
       for method in ("hooks", "func")},
    **{f"mean-{opt}": ["balance=mean", f"optimizer={opt}"]
       for opt in ("vr_sgd", "vr_momentum", "vr_adam")},
}  # fmt: skip


def _tensors(value, prefix: str = "") -> dict[str, object]:
    """Every leaf of nested dicts and lists, by its path."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, (list, tuple)):
        items = enumerate(value)
    else:
        return {prefix: value}
    return {k: v for key, item in items for k, v in _tensors(item, f"{prefix}/{key}").items()}


def _state(job, clips: bool = True) -> dict[str, object]:
    """The ordering, model and optimizer state, and the GSNR clip counts (``clips``: kept since
    the job was built, not in a checkpoint)."""
    parts = job.parts
    state = {
        "ordering": parts.ordering.state_dict(),
        "model": parts.model.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
    }
    if clips and parts.uses_gsnr:
        state["clips"] = parts.optimizer.clip_fractions(reset=False)
    return _tensors(state)


def _assert_same(got: dict[str, object], want: dict[str, object]) -> None:
    assert got.keys() == want.keys()
    for key, value in want.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(got[key], value), key
        else:
            assert got[key] == value or (value != value and got[key] != got[key]), key


def _train(overrides: list[str], captured: bool, epochs: int = EPOCHS, start: int = 0, job=None):
    job = job or compose_job([*SIZE, *overrides])
    if captured:
        job.captured = capture_step(job.parts)
    losses = train_epochs(job, epochs, start)
    return job, losses


@pytest.mark.parametrize("config", sorted(CONFIGS))
def test_replayed_steps_train_exactly_as_eager_ones(config):
    eager, eager_losses = _train(CONFIGS[config], captured=False)
    replayed, losses = _train(CONFIGS[config], captured=True)
    assert isinstance(replayed.captured.graph, TracedStep)  # it did capture and replay
    assert torch.equal(losses, eager_losses)
    _assert_same(_state(replayed), _state(eager))


@pytest.mark.parametrize("direction", ["captured-then-eager", "eager-then-captured"])
@pytest.mark.parametrize("balance", ["pair", "recursive"])
def test_a_checkpoint_resumes_across_captured_and_eager_runs(tmp_path, balance, direction):
    """The runner's own checkpoint (``_save``/``_restore``) after epoch 1 of one kind of run
    continues in the other kind exactly as an uninterrupted eager run."""
    overrides = [f"balance={balance}", "balance.kernel=probabilistic", "optimizer=vr_adam"]
    whole, whole_losses = _train(overrides, captured=False, epochs=3)
    first_captured = direction == "captured-then-eager"
    first, first_losses = _train(overrides, captured=first_captured, epochs=1)
    _save(tmp_path, first, 0, [], None, {})
    resumed = compose_job([*SIZE, *overrides])
    _restore(resumed, torch.load(tmp_path / "checkpoint.pt", weights_only=False))
    _, rest = _train(overrides, captured=not first_captured, epochs=2, start=1, job=resumed)
    assert torch.equal(torch.cat([first_losses, rest]), whole_losses)
    _assert_same(_state(resumed, clips=False), _state(whole, clips=False))


# ------------------------------------------------------------------ CUDA graphs (gpu)

GPU_SIZE = ("dataset.num_train=200",)  # 12 full batches, then one of 8 (eager, even for pair)


def _cuda_epochs(overrides: list[str], captured: bool) -> tuple[object, torch.Tensor]:
    """Two epochs on CUDA: the first captures at its second full batch (``torch.cuda.graph``
    synchronizes), the second runs every step, replays and the eager last batch, under
    ``set_sync_debug_mode("error")``; an eager run's optimizer is capturable too (the same
    arithmetic as a captured run's)."""
    job = compose_job([*GPU_SIZE, *overrides, f"trainer.cuda_graph={captured}"], device="cuda")
    assert (job.captured is not None) == captured  # the runner's own trainer.cuda_graph path
    make_capturable(job.parts.optimizer)
    losses = [train_epochs(job, 1)]
    job.parts.ordering.set_epoch(1)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        losses.append(train_epochs(job, 1, start=1))
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return job, torch.cat(losses)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", GRADIENT_FREE + BALANCES)
def test_captured_cuda_epochs_equal_eager_ones_without_a_sync(name, kernel):
    overrides = [f"balance={name}", f"balance.kernel={kernel}"]
    eager, eager_losses = _cuda_epochs(overrides, captured=False)
    captured, losses = _cuda_epochs(overrides, captured=True)
    assert captured.captured.graph is not None  # captured and replayed
    assert torch.equal(captured.parts.ordering.order, eager.parts.ordering.order)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-6, atol=0)
    for p, q in zip(captured.parts.model.parameters(), eager.parts.model.parameters(), strict=True):
        torch.testing.assert_close(p, q, rtol=1e-6, atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("optimizer", ["adam", "vr_adam"])
def test_a_captured_adam_step_counts_on_the_device(optimizer):
    """torch's Adam becomes capturable at the capture; VR-Adam counts on the device anyway."""
    eager, eager_losses = _cuda_epochs(["balance=mean", f"optimizer={optimizer}"], captured=False)
    captured, losses = _cuda_epochs(["balance=mean", f"optimizer={optimizer}"], captured=True)
    steps = [s["step"] for s in captured.parts.optimizer.state.values()]
    assert all(s.device.type == "cuda" for s in steps)
    assert torch.equal(captured.parts.ordering.order, eager.parts.ordering.order)
    torch.testing.assert_close(losses, eager_losses, rtol=1e-6, atol=0)


@pytest.mark.gpu
def test_a_capture_warns_nothing():
    """torch 2.14's deprecation of ``register_generator_state`` (a no-op there) is not shown at
    every capture; the probabilistic kernel's generator is registered."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _cuda_epochs(["balance=mean", "balance.kernel=probabilistic"], captured=True)


class Torch214Graph:
    """The part of torch 2.14's ``CUDAGraph`` at stake (a CPU has none): a deprecated no-op."""

    def __init__(self) -> None:
        self.registered: list[torch.Generator] = []

    def register_generator_state(self, generator: torch.Generator) -> None:
        warnings.warn(
            "CUDAGraph.register_generator_state() is deprecated, and will be removed in a "
            "future PyTorch release. It is now a no-op and can be safely removed from your code.",
            UserWarning,
            stacklevel=2,
        )
        self.registered.append(generator)


def test_generators_are_registered_without_torch_2_14s_deprecation_warning():
    graph, generators = Torch214Graph(), [torch.Generator(), torch.Generator()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        register_generators(graph, generators)
        register_generators(object(), generators)  # a torch without the method: nothing to do
    assert graph.registered == generators


# ------------------------------------------------------------------ what the option changes


def test_the_option_is_in_neither_the_run_directory_nor_the_fingerprint(compose):
    """A captured run and an eager one of the same config share a run directory and resume
    each other's checkpoints."""
    base = ["experiment=smoke", "balance=pair"]
    assert settings_hash([*base, "trainer.cuda_graph=true"]) == settings_hash(base)
    captured = config_fingerprint(compose([*base, "trainer.cuda_graph=true"]))
    assert captured == config_fingerprint(compose(base))


def test_make_capturable_moves_adams_host_step_counts_to_the_device():
    param = torch.nn.Parameter(torch.randn(3))
    adam = torch.optim.Adam([param], lr=0.1)
    param.grad = torch.randn(3)
    adam.step()  # an eager run's state: the step count lives on the host
    make_capturable(adam)
    step = adam.state[param]["step"]
    assert adam.param_groups[0]["capturable"] and step.device == param.device
    assert step.dtype == torch.float32 and step.item() == 1.0
    sgd = torch.optim.SGD([param], lr=0.1)  # keeps no step count: nothing to do
    make_capturable(sgd)
    assert "capturable" not in sgd.param_groups[0]
