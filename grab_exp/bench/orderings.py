"""Per-step time and state size of every ordering at the report's scale.

B = 16 examples per step, d = 62,006 (LeNet), n = 50,000 (CIFAR-10 train); recursive at every
depth of ``--depths`` (one row each, with its ``depth``).
"""

from __future__ import annotations

import argparse

import torch

from grab_exp.balance import Ordering, make_ordering
from grab_exp.bench.machine import add_device_option, bench_parser, bench_report, write_report
from grab_exp.bench.timing import EpochCursor, median_seconds


def bench_variant(name: str, n: int, d: int, batch: int, repeats: int, device, **options) -> dict:
    """Median seconds of one ``step`` of ``batch`` rows, and the state size in bytes
    (``options``: the ordering's own, e.g. ``depth``)."""
    if name == "recursive_pair":
        options = {"batch_size": batch}
    ordering = make_ordering(name, n, d, device=device, **options)
    generator = torch.Generator(device=device).manual_seed(0)
    grads = torch.randn(batch, d, generator=generator, device=device)  # (B, d)
    cursor = EpochCursor(ordering, batch)
    seconds = median_seconds(lambda: cursor.step(grads), torch.device(device), repeats)
    row = {"variant": name, **options}
    return {**row, "step_ms": seconds * 1e3, "state_bytes": ordering.state_bytes()}


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m grab_exp.bench orderings``."""
    parser = bench_parser("orderings", __doc__)
    parser.add_argument("--n", type=int, default=50_000, help="examples per epoch")
    parser.add_argument("--d", type=int, default=62_006, help="values per gradient")
    parser.add_argument("--batch", type=int, default=16, help="examples per step (B)")
    parser.add_argument("--repeats", type=int, default=200, help="timed steps per ordering")
    parser.add_argument(
        "--depths", default="5", help="comma-separated depths D of recursive, a row each"
    )
    add_device_option(parser)
    return parser


def main(argv: list[str] | None = None) -> list[dict]:
    """Print (and return) one row per ordering; write the JSON."""
    args = build_parser().parse_args(argv)
    depths = [int(depth) for depth in args.depths.split(",")]
    runs = []  # (ordering, options), in the registry's order
    for name in Ordering.choices():
        depth_options = [{"depth": depth} for depth in depths] if name == "recursive" else [{}]
        runs += [(name, options) for options in depth_options]
    rows = [
        bench_variant(name, args.n, args.d, args.batch, args.repeats, args.device, **options)
        for name, options in runs
    ]
    print(
        f"B={args.batch} d={args.d} n={args.n} device={args.device} threads="
        f"{torch.get_num_threads()} repeats={args.repeats}"
    )
    print(f"{'variant':<20}{'step (ms)':>12}{'state (bytes)':>16}")
    for row in rows:
        label = row["variant"] + (f" D={row['depth']}" if "depth" in row else "")
        print(f"{label:<20}{row['step_ms']:>12.3f}{row['state_bytes']:>16,}")
    write_report(args.out, bench_report("orderings", args, torch.device(args.device), rows=rows))
    return rows
