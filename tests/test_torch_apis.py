"""The torch and torchvision APIs the package and its tests call, present in the installed torch.

``pyproject.toml`` admits ``torch>=2.2,<2.15``, the GPU machine's 2.11 among them; this file is
the first check ``scripts/gpu_check.sh`` runs there, so an API newer than the machine's torch
shows up as one named failure before any job starts. Two are newer than torch 2.2, and the code
checks for them: the ``fp32_precision`` settings (torch 2.9; before, the legacy flags alone) and
``torch.compiler.set_stance`` (2.6; the compile test's recompile check).
"""

from __future__ import annotations

import importlib
import inspect
from functools import reduce

import pytest
import torch

APIS = [
    # per-sample gradients
    "torch.nn.grad.conv2d_weight",
    "torch.func.functional_call",
    "torch.func.grad",
    "torch.func.vmap",
    # seeded generators and the RNG state in checkpoints
    "torch.Generator.manual_seed",
    "torch.Generator.get_state",
    "torch.Generator.set_state",
    "torch.get_rng_state",
    "torch.set_rng_state",
    "torch.cuda.get_rng_state",
    "torch.cuda.get_rng_state_all",
    "torch.cuda.set_rng_state",
    "torch.cuda.manual_seed",
    # the CUDA numerics policy (trainer.tf32), devices and memory columns
    "torch.backends.cuda.matmul.fp32_precision",
    "torch.backends.cudnn.conv.fp32_precision",
    "torch.backends.cudnn.rnn.fp32_precision",
    "torch.backends.cuda.matmul.allow_tf32",
    "torch.backends.cudnn.allow_tf32",
    "torch.get_float32_matmul_precision",
    "torch.set_float32_matmul_precision",
    "torch.cuda.set_device",
    "torch.cuda.current_device",
    "torch.cuda.device_count",
    "torch.cuda.get_device_name",
    "torch.cuda.synchronize",
    "torch.cuda.memory_allocated",
    "torch.cuda.max_memory_allocated",
    "torch.cuda.reset_peak_memory_stats",
    "torch.cuda.empty_cache",
    # the sync-free checks (gpu tests and the CPU guard)
    "torch.cuda.set_sync_debug_mode",
    "torch.utils._python_dispatch.TorchDispatchMode",
    "torch.utils.weak.WeakIdKeyDictionary",
    # trainer.compile
    "torch.compile",
    "torch.compiler.cudagraph_mark_step_begin",
    "torch.compiler.set_stance",
    "torch._dynamo.reset",
    "torch._dynamo.utils.counters",
    # the bench's profiler and data-parallel jobs
    "torch.profiler.profile",
    "torch.profiler.record_function",
    "torch.autograd.profiler_util.MEMORY_EVENT_NAME",
    "torch.distributed.init_process_group",
    "torch.distributed.all_gather_into_tensor",
    "torch.distributed.all_gather_object",
    "torch.distributed.all_reduce",
    # the CIFAR-10 JPEG archive
    "torchvision.io.decode_jpeg",
    "torchvision.io.ImageReadMode.RGB",
    "torchvision.datasets.CIFAR10",
]
#: APIs newer than the oldest torch admitted, with the version that added them
SINCE = {
    "torch.backends.cuda.matmul.fp32_precision": (2, 9),
    "torch.backends.cudnn.conv.fp32_precision": (2, 9),
    "torch.backends.cudnn.rnn.fp32_precision": (2, 9),
    "torch.compiler.set_stance": (2, 6),
}
TORCH = tuple(int(part) for part in torch.__version__.split(".")[:2])


def _resolve(path: str) -> object:
    """The object at dotted ``path``: the longest importable module, then attributes."""
    parts = path.split(".")
    for split in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        return reduce(getattr, parts[split:], module)
    raise ImportError(path)


@pytest.mark.parametrize("path", APIS)
def test_the_api_exists(path):
    if SINCE.get(path, (0, 0)) > TORCH:
        pytest.skip(f"{path} is newer than torch {torch.__version__}")
    _resolve(path)


def test_the_calls_take_the_arguments_we_pass():
    assert "mode" in inspect.signature(torch.compile).parameters
    assert "dynamic" in inspect.signature(torch.compile).parameters
    assert {"randomness", "in_dims"} <= set(inspect.signature(torch.func.vmap).parameters)
    assert "device" in inspect.signature(_resolve("torchvision.io.decode_jpeg")).parameters
    torch.Generator("cpu").manual_seed(0).get_state()  # the CPU generator of every job
