"""The CUDA side of the device handling (``test_devices.py`` has what a CPU can show): resume
on the same device type and refusal on another, RNG restore with more saved GPU states than
GPUs, gathers of CPU tensors, ``cuda:k``, the numerics policy (in tests' jobs too),
deterministic recursive sums, both memory columns, the sampler on the parameters' device, the
same signs as on the CPU."""

from __future__ import annotations

import pytest
import torch
from support.grab_run import SMALL_RUN, compose_config, compose_job, run_job_here
from support.run_files import computed, read_rows

from grab_exp.balance import make_ordering
from grab_exp.balance.signs import sequential_signs
from grab_exp.devices import resolve_device
from grab_exp.distributed.comm import cpu_tensors
from grab_exp.runner.config.check import validate_config
from grab_exp.runner.config.schema import ConfigError
from grab_exp.runner.rundir.checkpoint import CHECKPOINT_NAME, restore_rng_states
from grab_exp.runner.training.connect import connect
from grab_exp.sampler import GraBSampler

pytestmark = pytest.mark.gpu
RUN = [*SMALL_RUN, "balance=recursive", "dataset.num_train=96", "balance.projection_dim=64"]


def test_a_cuda_run_resumes_on_cuda_and_is_refused_on_the_cpu(tmp_path):
    run_job_here([*RUN, "device=cuda", "epochs=1"], tmp_path)
    state = torch.load(tmp_path / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    assert state["device_type"] == "cuda" and state["ordering"]["generator_device"] == "cuda"
    assert state["ordering"]["projection"]["device_type"] == "cuda"
    assert state["ordering"]["generator"].device.type == "cpu"
    (tmp_path / "summary.json").unlink()  # interrupted after epoch 1
    with pytest.raises(ConfigError, match=r"^device: the checkpoint was written on cuda, this "):
        run_job_here([*RUN, "device=cpu", "epochs=2"], tmp_path)
    final = run_job_here([*RUN, "device=cuda", "epochs=2"], tmp_path)
    assert final["epoch"] == 2
    reference = run_job_here([*RUN, "device=cuda", "epochs=2"], tmp_path / "reference")
    assert computed([final]) == computed([reference])  # resumed == never interrupted


def test_rng_restore_with_more_saved_gpu_states_than_gpus():
    count = torch.cuda.device_count()
    torch.cuda.manual_seed(5)
    saved = torch.cuda.get_rng_state(0)
    restore_rng_states({"torch": torch.get_rng_state(), "cuda": [saved] * (count + 2)})
    assert torch.equal(torch.cuda.get_rng_state(0), saved)


def test_gathered_state_holds_cpu_tensors():
    state = make_ordering("recursive", 20, 6, device="cuda").state_dict()
    moved = cpu_tensors({"ordering": [state]})
    tensors = [v for v in moved["ordering"][0].values() if isinstance(v, torch.Tensor)]
    assert tensors and all(t.device.type == "cpu" for t in tensors)


def test_cuda_k_becomes_the_current_device():
    last = torch.cuda.device_count() - 1
    assert resolve_device(f"cuda:{last}") == torch.device("cuda", last)
    assert torch.cuda.current_device() == last
    torch.cuda.set_device(0)
    with pytest.raises(ConfigError, match=rf"^device: got 'cuda:{last + 1}'; allowed: cuda, "):
        validate_config(compose_config([*SMALL_RUN, f"device=cuda:{last + 1}"]))


@pytest.mark.parametrize("tf32", ["true", "false"])  # the default policy last: it stays
def test_cuda_jobs_run_deterministic_cudnn_without_tf32_unless_asked(tf32):
    connect(compose_config([*SMALL_RUN, "device=cuda", f"trainer.tf32={tf32}"]))
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    precision = "tf32" if tf32 == "true" else "ieee"
    assert torch.backends.cudnn.conv.fp32_precision == precision
    assert torch.backends.cuda.matmul.fp32_precision == precision
    a = torch.randn(256, 256, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    torch._dynamo.reset()
    compiled = torch.compile(torch.mm)(a, a)  # Dynamo and Inductor read the legacy flags
    torch.testing.assert_close(compiled, a @ a, rtol=1e-2, atol=1e-2)


def test_jobs_that_tests_build_get_the_runs_cuda_policy():
    """``support.grab_run.compose_job`` connects as a run does, so bit-for-bit asserts on CUDA
    hold in any test order (torch's defaults: cuDNN autotuning, TF32 convolutions)."""
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = False, True
    torch.backends.cudnn.allow_tf32 = True  # the legacy setter writes conv.fp32_precision too
    compose_job([], device="cuda")
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    assert torch.backends.cudnn.conv.fp32_precision == "ieee"


def test_recursive_orders_and_sums_are_bit_identical_run_to_run():
    n, d, b = 256, 4000, 64  # 64 examples share the root node: many repeated indices
    generator = torch.Generator(device="cuda").manual_seed(0)
    grads = torch.randn(n, d, device="cuda", generator=generator)

    def run():
        bal = make_ordering("recursive", n, d, depth=5, device="cuda", seed=3)
        for start in range(0, n, b):
            bal.step(grads[bal.order[start : start + b]])
        acc = bal.acc.clone()
        bal.set_epoch(1)
        return acc, bal.order.clone()

    first, again = run(), run()
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])


def test_cuda_runs_log_the_absolute_and_the_step_peak(tmp_path):
    run_job_here([*RUN, "device=cuda", "epochs=1"], tmp_path)
    _, rows = read_rows(tmp_path)
    peak, step = rows[0]["mem/peak_cuda_mb"], rows[0]["mem/step_peak_cuda_mb"]
    assert 0 < step < peak  # the data, model and state live below the step peak


def test_a_captured_runs_step_peak_is_its_captures_not_zero(tmp_path):
    """Replays allocate from the graph's private pool, unseen by the allocator's counters: both
    epochs (the capture's and a replay-only one) report the captured step's working memory."""
    run_job_here([*RUN, "device=cuda", "epochs=2"], tmp_path / "eager")
    run_job_here([*RUN, "device=cuda", "epochs=2", "trainer.cuda_graph=true"], tmp_path / "graph")
    eager, graph = (read_rows(tmp_path / name)[1] for name in ("eager", "graph"))
    for e, g in zip(eager, graph, strict=True):
        ratio = g["mem/step_peak_cuda_mb"] / e["mem/step_peak_cuda_mb"]
        assert 0.5 < ratio < 2, (e, g)
        assert g["mem/peak_cuda_mb"] > g["mem/step_peak_cuda_mb"]


def test_the_sampler_lives_on_its_parameters_device():
    model = torch.nn.Linear(5, 3).cuda()
    sampler = GraBSampler(40, model.parameters(), balance="mean")
    assert sampler.device.type == "cuda" and sampler.order.is_cuda


@pytest.mark.parametrize("rows", [1, 16, 64])
def test_sequential_signs_on_cuda_equal_the_cpus(rows):
    generator = torch.Generator().manual_seed(rows)
    v = torch.randn(rows, 7, generator=generator, dtype=torch.float64)
    dots = torch.randn(rows, generator=generator, dtype=torch.float64)
    thresholds = torch.rand(rows, generator=generator, dtype=torch.float64).mul_(-2).add_(1)
    cpu = sequential_signs(dots, v @ v.T, thresholds)
    cuda = sequential_signs(dots.cuda(), (v @ v.T).cuda(), thresholds.cuda())
    assert torch.equal(cuda.cpu(), cpu)
