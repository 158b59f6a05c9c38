"""Sorter cost with and without ``balance.projection_dim`` on a model of over a million values.

The model is an MLP 3072 -> 512 -> 256 -> 10 with ReLU (1,707,274 parameters, no BatchNorm);
its per-sample gradients of one batch of CIFAR-shaped random data come from the runner's
``PerSamplePipeline``. For mean and recursive (D = 5) balance, unprojected and sketched to
``k`` values (each projection kind), the benchmark measures the median time of one ordering
``step`` on those gradients (the dict, as in training), the ordering's state bytes, the scratch
buffers it keeps between steps, and the peak bytes one step allocates above what lives before
it (:mod:`grab_exp.bench.memory`). Each row gets the gradients ``pipeline.method=auto`` would
give it: factors where the ordering reads them (``takes_factors``), else the hook path's
materialized rows (recursive, and every sketch). ``materialize_ms`` is the alternative for a
sketch: materializing the factored blocks, which the sketch reads block by block.
"""

from __future__ import annotations

import argparse
import functools

import torch
from torch.nn import functional as F

from grab_exp.balance import make_ordering
from grab_exp.bench.machine import add_device_option, bench_parser, bench_report, write_report
from grab_exp.bench.memory import memory_method, peak_step_bytes, tensor_bytes
from grab_exp.bench.timing import EpochCursor, make_batch, median_seconds
from grab_exp.models import MLP
from grab_exp.per_sample import PerSamplePipeline

VARIANTS = {"mean": {}, "recursive": {"depth": 5}}
PROJECTIONS = (None, "rademacher", "countsketch")  # None: the full d values
HIDDEN = (512, 256)  # 1,707,274 parameters
QUICK_HIDDEN = (16,)  # --quick: 49,338 parameters


def gradients(hidden: tuple[int, ...], batch: int, device: torch.device, factors: bool):
    """A seeded MLP's per-sample gradients ``name -> (B, *shape)`` from ``method=auto`` for an
    ordering that reads factors or not, its size ``d``, the pipeline's median seconds and the
    method ``auto`` chose."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = MLP(hidden=hidden).to(device)
    x, y = make_batch(batch, device)  # (B, 3, 32, 32), (B,)
    pipeline = PerSamplePipeline(model, F.cross_entropy, factors=factors)
    seconds = median_seconds(lambda: pipeline(x, y), device, 3, warmup=1)
    _, grads = pipeline(x, y)
    return grads, sum(p.numel() for p in model.parameters()), seconds, pipeline.method


def materialize_seconds(grads, device: torch.device, repeats: int) -> float:
    """Median time to materialize every per-sample block (what a sketch of factored gradients
    adds: :mod:`~grab_exp.balance.projection` reads ``(B, *shape)`` blocks)."""
    return median_seconds(grads.as_dict, device, repeats)


def bench_ordering(name: str, kind: str | None, made: dict, d: int, args, device) -> dict:
    """Median step time, state bytes and step peak bytes of one configuration, on the
    gradients ``pipeline.method=auto`` gives it (``made``: ``takes_factors`` ->
    :func:`gradients`)."""
    options = dict(VARIANTS[name])
    if kind is not None:
        options.update(projection_dim=args.k, projection_kind=kind)
    ordering = make_ordering(name, args.n, d, device=device, **options)
    grads, _, _, method = made[ordering.takes_factors]
    one_step = functools.partial(EpochCursor(ordering, grads.rows).step, grads)
    seconds = median_seconds(one_step, device, args.repeats, warmup=args.warmup)
    return {
        "variant": name,
        "projection_dim": None if kind is None else args.k,
        "projection_kind": kind,
        "method": method,
        "step_ms": seconds * 1e3,
        "state_bytes": ordering.state_bytes(),
        "step_peak_bytes": peak_step_bytes(one_step, device),
        # buffers the ordering keeps between steps besides its state (the (B, d) concatenation
        # of a gradient dict without projection; only (B, k) ones with it)
        "scratch_bytes": tensor_bytes(ordering._scratch_buffers.values()),
    }


def with_ratios(rows: list[dict]) -> list[dict]:
    """Each row's time and state relative to its variant's unprojected row."""
    plain = {r["variant"]: r for r in rows if r["projection_dim"] is None}
    for row in rows:
        base = plain[row["variant"]]
        row["step_ratio"] = row["step_ms"] / base["step_ms"]
        row["state_ratio"] = row["state_bytes"] / base["state_bytes"]
    return rows


def print_table(report: dict) -> None:
    """A readable table of the report's rows."""
    s = report["settings"]
    print(
        f"model MLP{tuple(s['hidden'])} d={s['d']:,} B={s['batch']} n={s['n']} k={s['k']} "
        f"device={s['device']} threads={report['machine']['torch_threads']} "
        f"grads ms/batch: factored {report['grads_ms']['factored']:.1f}, hooks "
        f"{report['grads_ms']['hooks']:.1f}; factors materialized {report['materialize_ms']:.1f}"
    )
    print(
        f"{'variant':<11}{'sketch':<13}{'grads':<10}{'step ms':>10}{'x plain':>9}{'state MB':>10}"
        f"{'x plain':>9}{'scratch MB':>11}{'peak MB':>9}"
    )
    for r in report["rows"]:
        sketch = r["projection_kind"] or "none"
        print(
            f"{r['variant']:<11}{sketch:<13}{r['method']:<10}{r['step_ms']:>10.2f}{r['step_ratio']:>9.2f}"
            f"{r['state_bytes'] / 2**20:>10.2f}{r['state_ratio']:>9.4f}"
            f"{r['scratch_bytes'] / 2**20:>11.2f}"
            f"{r['step_peak_bytes'] / 2**20:>9.2f}"
        )


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m grab_exp.bench projection``."""
    parser = bench_parser("projection", __doc__)
    parser.add_argument("--k", type=int, default=256, help="projection_dim of the sketches")
    parser.add_argument("--batch", type=int, default=16, help="examples per step (B)")
    parser.add_argument("--n", type=int, default=50_000, help="examples per epoch")
    parser.add_argument("--repeats", type=int, default=15, help="timed steps per row")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per row first")
    parser.add_argument("--quick", action="store_true", help="small MLP, 2 repeats (a smoke run)")
    add_device_option(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    if args.quick:
        args.repeats, args.warmup, args.n = 2, 1, 64
    hidden = QUICK_HIDDEN if args.quick else HIDDEN
    device = torch.device(args.device)
    made = {factors: gradients(hidden, args.batch, device, factors) for factors in (True, False)}
    d = made[False][1]
    rows = [bench_ordering(v, k, made, d, args, device) for v in VARIANTS for k in PROJECTIONS]
    report = bench_report(
        "projection",
        args,
        device,
        {"hidden": list(hidden), "d": d, "device": str(device)},
        memory_method=memory_method(device),
        grads_ms={method: seconds * 1e3 for _, _, seconds, method in made.values()},
        # the alternative to the hook path's rows for a sketch: materialize the factors
        materialize_ms=materialize_seconds(made[True][0], device, args.repeats) * 1e3,
        rows=with_ratios(rows),
    )
    print_table(report)
    write_report(args.out, report)
    return report
