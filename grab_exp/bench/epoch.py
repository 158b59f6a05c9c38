"""Training-step cost of every Table 1 row, relative to the plain PyTorch loop.

LeNet on CIFAR-10-shaped data, batch 16, all rows in one process: warm-up, then interleaved
repeats (row 1, row 2, ..., row 1, row 2, ...) so that drifts of the machine hit every row alike.
Each repeat times ``--steps`` whole training steps; a separately timed step gives the breakdown
(per-sample gradients, sorter step, optimizer). Medians are extrapolated to an epoch of 50,000.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.nn import functional as F

from grab_exp.balance import make_balance
from grab_exp.bench.machine import describe_machine
from grab_exp.bench.timing import synchronize
from grab_exp.models import LeNet
from grab_exp.report.variants import ROW_ORDER
from grab_exp.runner.pipeline import ClassicPipeline, FunctionalPipeline

ROWS = ROW_ORDER  # Table 1's rows, in the report's order
EPOCH_EXAMPLES = 50_000


@dataclass
class Row:
    """One Table 1 row ready to train: model, optimizer, pipeline, ordering."""

    name: str
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    pipeline: object
    sorter: object
    step_times: list[float]
    parts: dict[str, list[float]]


def build_row(variant: str, pipeline: str, args, device: torch.device) -> Row:
    """LeNet + the report's SGD + pipeline + ordering for one row."""
    torch.manual_seed(0)
    model = LeNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9, weight_decay=0.01)
    if pipeline == "classic":
        runner = ClassicPipeline(model, F.cross_entropy)
    else:
        runner = FunctionalPipeline(model, F.cross_entropy, method=args.method)
    options = {"depth": 5} if variant == "recursive" else {}
    if variant == "recursive_pair":
        options = {"batch_size": args.batch}
    d = sum(p.numel() for p in model.parameters())
    sorter = make_balance(variant, EPOCH_EXAMPLES, d, device=device, **options)
    name = variant if pipeline == "functional" else f"{variant}-{pipeline}"
    return Row(name, model, optimizer, runner, sorter, [], {"grads": [], "sorter": [], "opt": []})


def _timed(fn, device: torch.device) -> tuple[object, float]:
    synchronize(device)
    start = time.perf_counter()
    out = fn()
    synchronize(device)
    return out, time.perf_counter() - start


def _untimed(name: str, fn):
    return fn()


def _timed_stages(row: Row, device: torch.device):
    def stage(name: str, fn):
        out, seconds = _timed(fn, device)
        row.parts[name].append(seconds)
        return out

    return stage


def train_step(row: Row, x: torch.Tensor, y: torch.Tensor, stage=_untimed) -> None:
    """One training step; ``stage(name, fn)`` runs (and may time) each of its three parts."""
    sorter = row.sorter
    if sorter.pos + len(x) > sorter.n:
        sorter.set_epoch(sorter.epoch + 1)
    row.optimizer.zero_grad(set_to_none=True)
    _, grads = stage("grads", lambda: row.pipeline(x, y))
    if sorter.needs_grads:
        stage("sorter", lambda: sorter.step(grads))
    else:
        stage("sorter", lambda: sorter.step(None, sorter.order[sorter.pos : sorter.pos + len(x)]))
    stage("opt", row.optimizer.step)


def time_rows(rows: list[Row], args, device: torch.device) -> None:
    """Warm-up, then interleaved repeats of ``args.steps`` steps per row."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch, 3, 32, 32, generator=generator).to(device)  # (B, 3, 32, 32)
    y = torch.randint(0, 10, (args.batch,), generator=generator).to(device)  # (B,)
    for row in rows:
        for _ in range(args.warmup):
            train_step(row, x, y)
    for _ in range(args.repeats):
        for row in rows:
            _, seconds = _timed(
                lambda row=row: [train_step(row, x, y) for _ in range(args.steps)], device
            )
            row.step_times.append(seconds / args.steps)
            train_step(row, x, y, _timed_stages(row, device))


def summarize(rows: list[Row], args, device: torch.device) -> dict:
    """Medians, per-epoch extrapolation, ratios to classic RR, memory."""
    steps_per_epoch = math.ceil(EPOCH_EXAMPLES / args.batch)
    base = statistics.median(rows[0].step_times)
    results = []
    for row in rows:
        step = statistics.median(row.step_times)
        results.append(
            {
                "row": row.name,
                "step_ms": step * 1e3,
                "epoch_s": step * steps_per_epoch,
                "ratio_to_classic_rr": step / base,
                "breakdown_ms": {k: statistics.median(v) * 1e3 for k, v in row.parts.items()},
                "sorter_state_bytes": row.sorter.state_bytes(),
            }
        )
    return {
        "benchmark": "epoch",
        "settings": {**vars(args), "device": str(device), "epoch_examples": EPOCH_EXAMPLES},
        "machine": describe_machine(device),
        "rows": results,
    }


def print_table(report: dict) -> None:
    """A readable table of the report's rows."""
    print(
        f"{'row':<18}{'step ms':>9}{'epoch s':>9}{'x classic':>10}{'grads':>8}"
        f"{'sorter':>8}{'opt':>7}{'state MB':>10}"
    )
    for r in report["rows"]:
        b = r["breakdown_ms"]
        print(
            f"{r['row']:<18}{r['step_ms']:>9.2f}{r['epoch_s']:>9.1f}"
            f"{r['ratio_to_classic_rr']:>10.2f}{b['grads']:>8.2f}{b['sorter']:>8.2f}"
            f"{b['opt']:>7.2f}{r['sorter_state_bytes'] / 2**20:>10.2f}"
        )


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the table, write the JSON."""
    parser = argparse.ArgumentParser(prog="python -m grab_exp.bench epoch")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--steps", type=int, default=20, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--method", default="auto", help="per-sample gradients: func|hooks|auto")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--out", default="results/bench/epoch.json")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    rows = [build_row(v, p, args, device) for v, p in ROWS]
    time_rows(rows, args, device)
    report = summarize(rows, args, device)
    print_table(report)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")
    return report
