"""Peak memory of a big model's training step, as each process's peak RSS.

``python -m grab_exp.bench rss`` runs every arm in a fresh subprocess: the MLP 3072 -> 2048 ->
2048 -> 10 (10.5M parameters), batch 16, SGD with momentum, ``--steps`` training steps of
:func:`grab_exp.runner.training.step.train_step` (the per-sample check on, as by default: calls
1, 2 and 4 are checked), then the process's peak resident set size (``ru_maxrss``). The arms:
classic RR (plain ``loss.backward()``), and GraB mean with per-sample gradients ``factored``
(Linear layers as factors, no ``(B, d)`` matrix) and ``hooks`` (materialized into the reused
``(B, d)`` buffer). The difference to classic's peak includes the ordering's state (``3 d``
float32 values for mean: accumulator, stale mean, gradient sum).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys

import torch
from torch.nn import functional as F

from grab_exp.bench.machine import bench_parser, bench_report, write_report
from grab_exp.models import MLP
from grab_exp.per_sample import ClassicPipeline, PerSamplePipeline
from grab_exp.runner.training.step import StepParts, train_step
from grab_exp.sampler import GraBSampler

#: arm -> (ordering, pipeline method; ``classic``: no per-sample gradients)
ARMS = {
    "classic": ("rr", "classic"),
    "mean-factored": ("mean", "factored"),
    "mean-hooks": ("mean", "hooks"),
}
HIDDEN = (2048, 2048)
N = 1024


def run_arm(arm: str, batch: int, steps: int) -> dict:
    """Build the arm, train ``steps`` steps, return its peak RSS and sizes (in this process)."""
    variant, method = ARMS[arm]
    torch.manual_seed(0)
    model = MLP(hidden=HIDDEN)
    d = sum(p.numel() for p in model.parameters())
    if method == "classic":
        pipeline = ClassicPipeline(model, F.cross_entropy)
    else:
        pipeline = PerSamplePipeline(model, F.cross_entropy, method=method)
    sampler = GraBSampler(N, d, balance=variant)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    parts = StepParts(model, optimizer, pipeline, sampler)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))
    for step in range(steps):
        start = step * batch % (N - N % batch)
        train_step(parts, x, y, sampler.order[start : start + batch])
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return {"arm": arm, "d": d, "peak_rss_bytes": peak_kib * 1024, "state": sampler.state_bytes()}


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m grab_exp.bench rss``."""
    parser = bench_parser("rss", __doc__)
    parser.add_argument("--batch", type=int, default=16, help="examples per step (B)")
    parser.add_argument("--steps", type=int, default=6, help="training steps per arm")
    parser.add_argument("--arm", help=argparse.SUPPRESS)  # the child process's one arm
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run every arm in its own process; print and write the peaks and their excess."""
    args = build_parser().parse_args(argv)
    if args.arm:
        print(json.dumps(run_arm(args.arm, args.batch, args.steps)))
        return {}
    rows = []
    for arm in ARMS:
        command = [sys.executable, "-m", "grab_exp.bench", "rss", "--arm", arm]
        command += ["--batch", str(args.batch), "--steps", str(args.steps)]
        output = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(output.strip().splitlines()[-1]))
    base = rows[0]["peak_rss_bytes"]
    for row in rows:
        row["above_classic_bytes"] = row["peak_rss_bytes"] - base
        row["allowed_bytes"] = 3 * row["d"] * 4 + 96 * 2**20  # Done-when: state + 96 MB
        print(
            f"{row['arm']:<15}{row['peak_rss_bytes'] / 2**20:>10.0f} MB peak RSS"
            f"{row['above_classic_bytes'] / 2**20:>10.0f} MB above classic"
        )
    report = bench_report("rss", args, torch.device("cpu"), rows=rows)
    write_report(args.out, report)
    return report
