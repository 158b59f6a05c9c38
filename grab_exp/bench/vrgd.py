"""Step cost of the ``vrgd_large_batch`` arms at large batch sizes, on an idle machine.

The arms of ``conf/arm/``: SGD-momentum and Adam on the plain loop (``loss.backward()``),
VR-Momentum and VR-Adam on per-sample gradients plus the GSNR. For each batch size, the four arms
are timed in one process with interleaved repeats (as :mod:`grab_exp.bench.epoch`, whose rows and
timing it reuses), and the median step is extrapolated to an epoch of 50,000 examples. The VRGD
report (``python -m grab_exp.report vrgd --bench``) turns "epochs to a target accuracy"
into training time at these speeds, free of the load other jobs put on a shared machine.
"""

from __future__ import annotations

import argparse

import torch

from grab_exp.bench.epoch import EPOCH_EXAMPLES, build_row, summarize, time_rows
from grab_exp.bench.machine import add_device_option, bench_parser, bench_report, write_report
from grab_exp.report.table1_table import swept
from grab_exp.runner.rundir.identity import conf_choices


def arm_choices(arm: str) -> tuple[str, str]:
    """``(pipeline, optimizer)`` that ``conf/arm/<arm>.yaml`` overrides (ordering: rr)."""
    chosen = conf_choices(f"arm/{arm}")
    return chosen["pipeline"], chosen["optimizer"]


#: arm -> (pipeline, optimizer option), read from conf/ (the arms exist there only), in the order
#: of ``experiment=vrgd_large_batch``'s sweep (the first is the base)
ARMS = {arm: arm_choices(arm) for arm in swept("vrgd_large_batch", "arm")}


def time_batch(batch: int, args, device: torch.device) -> list[dict]:
    """Median step and epoch time of every arm at ``batch``; ratios to ``sgd_momentum``."""
    settings = argparse.Namespace(**{**vars(args), "batch": batch})
    rows = [build_row("rr", p, settings, device, optimizer=o) for p, o in ARMS.values()]
    time_rows(rows, settings, device)
    timed = summarize(rows, settings, device)["rows"]  # the first row (sgd_momentum) is the base
    return [
        {
            "arm": arm,
            "batch_size": batch,
            "step_ms": row["step_ms"],
            "epoch_s": row["epoch_s"],
            "ratio_to_sgd_momentum": row["ratio_to_classic_rr"],
            "gsnr_ms": row["breakdown_ms"]["gsnr"],
        }
        for arm, row in zip(ARMS, timed, strict=True)
    ]


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m grab_exp.bench vrgd``."""
    parser = bench_parser("vrgd", __doc__)
    parser.add_argument("--batches", default="256,1024,4096", help="comma-separated batch sizes")
    parser.add_argument("--steps", type=int, default=2, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved timed repeats")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per arm first")
    parser.add_argument("--method", default="auto", help="per-sample gradients: func|hooks|auto")
    add_device_option(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Time every arm at every batch size, print a table, write the JSON."""
    args = build_parser().parse_args(argv)
    device = torch.device(args.device)
    batches = [int(b) for b in args.batches.split(",")]
    rows = [row for batch in batches for row in time_batch(batch, args, device)]
    settings = {"device": str(device), "epoch_examples": EPOCH_EXAMPLES}
    report = bench_report("vrgd", args, device, settings, rows=rows)
    print(f"{'batch':>6} {'arm':<13} {'step ms':>9} {'epoch s':>8} {'x sgd':>6} {'gsnr ms':>8}")
    for r in rows:
        gsnr = "-" if r["gsnr_ms"] is None else f"{r['gsnr_ms']:.1f}"
        print(
            f"{r['batch_size']:>6} {r['arm']:<13} {r['step_ms']:>9.1f} {r['epoch_s']:>8.1f} "
            f"{r['ratio_to_sgd_momentum']:>6.2f} {gsnr:>8}"
        )
    write_report(args.out, report)
    return report
