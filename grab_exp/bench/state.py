"""Training-state memory of Table 1's rows: the bytes a training process allocates for training.

What the report's peak GPU memory holds, its dataset on the host: per row, after warm-up steps,

* ``model``: the parameters; ``gradients``: their ``.grad``; ``optimizer``: the optimizer's
  state (SGD's momentum buffers);
* ``per_sample``: what the per-sample path keeps between steps (the hook path's reused
  ``(B, d)`` buffer; the factored path keeps none);
* ``ordering``: the ordering's state (orders, accumulators, stale means: ``state_bytes()``);
* ``step_peak``: the step's working memory, the most bytes live at once above those live at its
  start (:func:`~grab_exp.bench.memory.peak_step_bytes`: on the CPU from the profiler's
  allocation events, on CUDA from the allocator's counters);

and ``total``, their sum. The sizes are those of the tensors torch allocates, so a loaded machine
measures the same bytes as an idle one. Buffers outside torch's allocator (oneDNN or BLAS
scratch on the CPU, cuDNN workspaces on CUDA) are not counted.
"""

from __future__ import annotations

import argparse

import torch

from grab_exp.bench.epoch import ROWS, Row, bench_step, build_row
from grab_exp.bench.machine import add_device_option, bench_parser, bench_report, write_report
from grab_exp.bench.memory import memory_method, peak_step_bytes, tensor_bytes
from grab_exp.bench.timing import make_batch

PARTS = ("model", "gradients", "optimizer", "per_sample", "ordering", "step_peak")


def training_state(row: Row, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> dict:
    """Bytes of each part of :data:`PARTS` for one warmed-up row, and their ``total``."""
    step = row.step
    params = list(step.model.parameters())
    states = step.optimizer.state.values()
    sizes = {
        "model": tensor_bytes(params),
        "gradients": tensor_bytes(p.grad for p in params if p.grad is not None),
        "optimizer": tensor_bytes(t for s in states for t in s.values() if torch.is_tensor(t)),
        "per_sample": step.pipeline.state_bytes(),
        "ordering": row.step.ordering.state_bytes(),
        "step_peak": peak_step_bytes(lambda: bench_step(row, x, y), device),
    }
    return {**sizes, "total": sum(sizes.values())}


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m grab_exp.bench state``."""
    parser = bench_parser("state", __doc__)
    parser.add_argument("--batch", type=int, default=16, help="examples per step (B)")
    parser.add_argument("--warmup", type=int, default=3, help="steps per row before measuring")
    parser.add_argument(
        "--method", default="auto", help="per-sample gradients: func|hooks|factored|auto"
    )
    add_device_option(parser)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    """Measure every Table 1 row; print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    x, y = make_batch(args.batch, device)
    rows = []
    for variant, pipeline in ROWS:
        row = build_row(variant, pipeline, args, device)
        for _ in range(args.warmup):
            bench_step(row, x, y)
        method = getattr(row.step.pipeline, "method", "classic")
        rows.append({"row": row.name, "method": method, **training_state(row, x, y, device)})
    print(f"{'row':<16}" + "".join(f"{p:>12}" for p in (*PARTS, "total")) + "   (MiB)")
    for r in rows:
        print(f"{r['row']:<16}" + "".join(f"{r[p] / 2**20:>12.3f}" for p in (*PARTS, "total")))
    report = bench_report("state", args, device, memory_method=memory_method(device), rows=rows)
    write_report(args.out, report)
    return rows
