#!/usr/bin/env python3
"""The first call on a GPU machine: the answers that decide the rest, in under 2 minutes.

    python scripts/gpu_probe.py [--out DIR] [--device cuda] [--rehearse]

Needs torch and this package only (no hydra, pandas or W&B). Writes ``DIR/probe.jsonl`` (``$OUT``
by default): one JSON object a line, written as each probe ends, so a time limit keeps what
finished. A probe that fails records its error (``"ok": false``) and the next one runs:

* ``versions``: Python, torch, CUDA, cuDNN, the device and its memory.
* ``capture``, one line per ordering and kernel: LeNet, SGD and the ordering over 2 short epochs
  of random CIFAR-shaped data, eagerly and captured (``trainer.cuda_graph``; traced on the CPU):
  whether the orders are equal, the largest loss and parameter differences, the median ms of an
  eager and of a replayed step.
* ``sync``, one line per ordering and VRGD optimizer (CUDA only): their eager steps under
  ``torch.cuda.set_sync_debug_mode("error")``.
* ``conv_determinism``, with cuDNN determinism on and off: the per-sample grouped convolution's
  weight gradients computed twice, bit-identical or not.
* ``compile``: one cold ``torch.compile`` of LeNet's forward and backward (a fresh Inductor
  cache), its seconds: what the check's compile tests are sized from.

``--rehearse``: the CPU rehearsal, smaller (under a minute on 2 cores; CI runs it).
Exit 0 when every probe ran (whatever it found), 1 when one raised, 2 on bad input.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grab_exp.balance import Ordering, make_ordering
from grab_exp.devices import set_cuda_policy
from grab_exp.models import LeNet
from grab_exp.optim import VRSGD, VRAdam, VRMomentum
from grab_exp.per_sample import PerSamplePipeline
from grab_exp.per_sample.rules.conv2d import grouped_weight_grads
from grab_exp.runner.training.capture import capture_step
from grab_exp.runner.training.step import StepParts, train_step

KERNELS = ("deterministic", "probabilistic")
BATCH = 16


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT"), help="folder (default: $OUT)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    parser.add_argument("--rehearse", action="store_true", help="the CPU rehearsal, smaller")
    return parser


class Probes:
    """Runs probes in order, each line appended to ``probe.jsonl`` as it ends."""

    def __init__(self, path: Path) -> None:
        self.path, self.failed = path, False
        path.write_text("")

    def run(self, name: str, fn: Callable[[], dict], **labels) -> dict:
        started = time.perf_counter()
        try:
            line = {"probe": name, **labels, "ok": True, **fn()}
        except Exception as error:  # a probe's failure is its answer; the next one runs
            self.failed = True
            lines = traceback.format_exception_only(error)
            line = {"probe": name, **labels, "ok": False, "error": "".join(lines).strip()}
        line["seconds"] = round(time.perf_counter() - started, 3)
        with self.path.open("a") as file:
            file.write(json.dumps(line) + "\n")
        print(json.dumps(line), flush=True)
        return line


def versions(device: torch.device) -> dict:
    info = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "device": str(device),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=list(torch.cuda.get_device_capability(device)))
        info["memory_gib"] = round(props.total_memory / 2**30, 1)
    return info


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _parts(name: str, kernel: str | None, n: int, device: torch.device, optimizer=None):
    """LeNet, ``optimizer`` (``params -> optimizer``; SGD by default), the per-sample pipeline
    and the ordering, as a run builds them."""
    torch.manual_seed(0)
    model = LeNet().to(device)
    d = sum(p.numel() for p in model.parameters())
    options = {"batch_size": BATCH} if name == "recursive_pair" else {}
    if kernel is not None:
        options["kernel"] = kernel
    ordering = make_ordering(name, n, d, device=device, **options)
    pipeline = PerSamplePipeline(model, F.cross_entropy, factors=ordering.takes_factors)
    make = optimizer or (lambda params: torch.optim.SGD(params, lr=0.01))
    return StepParts(model, make(model.parameters()), pipeline, ordering)


def _epochs(parts: StepParts, data, epochs: int, captured: bool) -> tuple[list, list, list]:
    """Orders, losses ``()`` per step and step seconds of ``epochs`` epochs (full batches)."""
    x_all, y_all = data
    step = capture_step(parts) if captured else None
    orders, losses, seconds = [], [], []
    for epoch in range(epochs):
        parts.ordering.set_epoch(epoch)
        orders.append(parts.ordering.order.clone())
        for indices in parts.ordering.index_batches(BATCH):
            x, y = x_all[indices], y_all[indices]
            _synchronize(x.device)
            started = time.perf_counter()
            loss = step(x, y, indices) if step else train_step(parts, x, y, indices)
            losses.append(loss.detach().clone())
            _synchronize(x.device)
            seconds.append(time.perf_counter() - started)
    return orders, losses, seconds


def capture_vs_eager(name: str, kernel: str | None, n: int, device: torch.device) -> dict:
    generator = torch.Generator().manual_seed(0)
    data = (
        torch.randn(n, 3, 32, 32, generator=generator).to(device),
        torch.randint(0, 10, (n,), generator=generator).to(device),
    )
    eager_parts, graph_parts = (_parts(name, kernel, n, device) for _ in range(2))
    eager = _epochs(eager_parts, data, 2, captured=False)
    graph = _epochs(graph_parts, data, 2, captured=True)
    pairs = zip(eager_parts.model.parameters(), graph_parts.model.parameters(), strict=True)
    return {
        "orders_equal": all(torch.equal(a, b) for a, b in zip(eager[0], graph[0], strict=True)),
        "max_loss_diff": max(abs(a - b).item() for a, b in zip(eager[1], graph[1], strict=True)),
        "max_param_diff": max((p - q).abs().max().item() for p, q in pairs),
        "eager_step_ms": statistics.median(eager[2][2:]) * 1e3,
        "replay_step_ms": statistics.median(graph[2][2:]) * 1e3,  # after the eager and capture
    }


def sync_free(name: str, kernel: str | None, device: torch.device, optimizer=None) -> dict:
    n = 4 * BATCH
    generator = torch.Generator().manual_seed(0)
    x_all = torch.randn(n, 3, 32, 32, generator=generator).to(device)
    y_all = torch.randint(0, 10, (n,), generator=generator).to(device)
    parts = _parts(name, kernel, n, device, optimizer)
    batches = [(x_all[i], y_all[i], i) for i in parts.ordering.index_batches(BATCH)]
    train_step(parts, *batches[0])  # first calls check and allocate outside the guard
    torch.cuda.synchronize(device)
    torch.cuda.set_sync_debug_mode("error")
    try:
        for batch in batches[1:]:
            train_step(parts, *batch)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    return {}


def conv_determinism(deterministic: bool, device: torch.device) -> dict:
    torch.backends.cudnn.deterministic = deterministic
    layer = torch.nn.Conv2d(6, 16, 5).to(device)
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(BATCH, 6, 14, 14, generator=generator).to(device)
    g = torch.randn(BATCH, 16, 10, 10, generator=generator).to(device)
    first, second = (grouped_weight_grads(layer, a, g).clone() for _ in range(2))
    set_cuda_policy(device, tf32=False)  # back to a run's policy
    return {"bit_identical": torch.equal(first, second)}


def cold_compile(device: torch.device, rehearse: bool) -> dict:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="probe_inductor_")
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10).to(device) if rehearse else LeNet().to(device)
    x = torch.randn(BATCH, 64, device=device) if rehearse else torch.randn(BATCH, 3, 32, 32)
    compiled = torch.compile(model)
    started = time.perf_counter()
    labels = torch.zeros(BATCH, dtype=torch.long, device=device)
    F.cross_entropy(compiled(x.to(device)), labels).backward()
    _synchronize(device)
    return {"model": type(model).__name__, "cold_compile_s": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.out:
        print("error: --out: got nothing; allowed: a folder (or set $OUT)", file=sys.stderr)
        return 2
    gpu = torch.cuda.is_available()
    if args.device not in ("cuda", "cpu") or (args.device == "cuda" and not gpu):
        allowed = "cuda, cpu" if gpu else "cpu (no GPU here)"
        print(f"error: --device: got {args.device!r}; allowed: {allowed}", file=sys.stderr)
        return 2
    device = torch.device(args.device)
    set_cuda_policy(device, tf32=False)  # the numerics of a training run
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    probes = Probes(out / "probe.jsonl")
    probes.run("versions", lambda: versions(device))
    n = 3 * BATCH if args.rehearse else 8 * BATCH
    for name, cls in Ordering.choices().items():
        for kernel in KERNELS if cls.needs_grads else (None,):
            probe = functools.partial(capture_vs_eager, name, kernel, n, device)
            probes.run("capture", probe, ordering=name, kernel=kernel)
    if device.type == "cuda":
        for name, cls in Ordering.choices().items():
            kernel = "probabilistic" if cls.needs_grads else None
            probes.run("sync", functools.partial(sync_free, name, kernel, device), ordering=name)
        for optimizer in (VRSGD, VRMomentum, VRAdam):
            make = functools.partial(optimizer, lr=0.01, groups=4)
            probe = functools.partial(sync_free, "rr", None, device, make)
            probes.run("sync", probe, optimizer=optimizer.__name__)
        for deterministic in (True, False):
            probe = functools.partial(conv_determinism, deterministic, device)
            probes.run("conv_determinism", probe, cudnn_deterministic=deterministic)
    probes.run("compile", lambda: cold_compile(device, args.rehearse))
    return 1 if probes.failed else 0


if __name__ == "__main__":
    sys.exit(main())
