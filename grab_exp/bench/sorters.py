"""Per-step time and state size of every ordering at the report's scale.

B = 16 examples per step, d = 62,006 (LeNet), n = 50,000 (CIFAR-10 train).
"""

from __future__ import annotations

import argparse

import torch

from grab_exp.balance import Ordering, make_ordering
from grab_exp.bench.machine import describe_machine, write_report
from grab_exp.bench.timing import median_seconds

OPTIONS = {"recursive": {"depth": 5}, "recursive_pair": {"batch_size": 16}}


def bench_variant(name: str, n: int, d: int, batch: int, repeats: int, device) -> dict:
    """Median seconds of one ``step`` of ``batch`` rows, and the state size in bytes."""
    options = OPTIONS.get(name, {})
    if name == "recursive_pair":
        options = {"batch_size": batch}
    sorter = make_ordering(name, n, d, device=device, **options)
    generator = torch.Generator(device=device).manual_seed(0)
    grads = torch.randn(batch, d, generator=generator, device=device)  # (B, d)
    steps_per_epoch = n // batch

    def one_step() -> None:
        if sorter.pos + batch > steps_per_epoch * batch:
            sorter.set_epoch(sorter.epoch + 1)
        sorter.step(grads)

    seconds = median_seconds(one_step, torch.device(device), repeats)
    return {"variant": name, "step_ms": seconds * 1e3, "state_bytes": sorter.state_bytes()}


def main(argv: list[str] | None = None) -> list[dict]:
    """Print (and return) one row per ordering."""
    parser = argparse.ArgumentParser(prog="python -m grab_exp.bench sorters")
    parser.add_argument("--n", type=int, default=50_000)
    parser.add_argument("--d", type=int, default=62_006)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=200)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--json", default=None, help="also write the JSON to this file")
    args = parser.parse_args(argv)
    rows = [
        bench_variant(name, args.n, args.d, args.batch, args.repeats, args.device)
        for name in Ordering.choices()
    ]
    print(
        f"B={args.batch} d={args.d} n={args.n} device={args.device} threads="
        f"{torch.get_num_threads()} repeats={args.repeats}"
    )
    print(f"{'variant':<16}{'step (ms)':>12}{'state (bytes)':>16}")
    for row in rows:
        print(f"{row['variant']:<16}{row['step_ms']:>12.3f}{row['state_bytes']:>16,}")
    if args.json:
        report = {
            "benchmark": "sorters",
            "settings": vars(args),
            "machine": describe_machine(torch.device(args.device)),
            "rows": rows,
        }
        write_report(args.json, report)
    return rows
