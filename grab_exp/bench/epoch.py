"""Training-step cost of every Table 1 row and of the VRGD optimizers, relative to plain PyTorch.

LeNet on CIFAR-10-shaped data, batch 16, all rows in one process: warm-up, then interleaved
repeats (row 1, row 2, ..., row 1, row 2, ...) so that drifts of the machine hit every row alike.
Each repeat times ``--steps`` whole training steps; a separately timed step gives the breakdown
(per-sample gradients, GSNR, ordering step, optimizer), and each stage against its limit on this
machine (:mod:`grab_exp.bench.limits`: the bytes and flops it must move and do, at the stream
and matmul rates measured right after the timing). Medians are extrapolated to an epoch of
50,000. Last, the peak memory of one step per row (:mod:`grab_exp.bench.memory`), outside the
timed steps, and the operators of one step: eager, eager with CUDA's sign loop, and captured
(``trainer.cuda_graph``: one graph launch and the input copies per step, and the kernels
inside the graph). Right after the timing, where each row's time goes: ``--profile-steps`` steps
under ``torch.profiler``, per stage and operator
(:func:`~grab_exp.bench.operators.operator_times`). With ``--captured`` (the default on CUDA)
Table 1's rows are timed a second time captured (``<row>:graph``; no breakdown: a graph runs as
one). The method is written down in ``results/bench/README.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from grab_exp.bench.limits import machine_rates, multiples, stage_limits
from grab_exp.bench.machine import add_device_option, bench_parser, bench_report, write_report
from grab_exp.bench.memory import memory_method, peak_step_bytes
from grab_exp.bench.operators import OperatorCount, operator_times
from grab_exp.bench.timing import EpochCursor, make_batch, timed
from grab_exp.devices import graph_safe, set_cuda_policy
from grab_exp.report.table1_table import ROW_ORDER
from grab_exp.runner.launch.override_keys import compose_config
from grab_exp.runner.rundir.resolvers import variant_dir
from grab_exp.runner.training.build import build_parts
from grab_exp.runner.training.capture import CapturedStep, capture_step
from grab_exp.runner.training.step import STAGES as STEP_STAGES
from grab_exp.runner.training.step import StepParts, train_step, untimed
from grab_exp.runner.training.strategy import Strategy
from grab_exp.trace import TracedStep
from grab_exp.validation import check_int_at_least

ROWS = ROW_ORDER  # Table 1's rows, in the report's order
#: VRGD rows ``(variant, pipeline, optimizer)``: every VR optimizer with RR, VR-Momentum with mean
GSNR_ROWS = (
    ("rr", "functional", "vr_sgd"),
    ("rr", "functional", "vr_momentum"),
    ("rr", "functional", "vr_adam"),
    ("mean", "functional", "vr_momentum"),
)
EPOCH_EXAMPLES = 50_000
STAGES = tuple(s for s in STEP_STAGES if s != "reduce")  # one process: nothing to reduce


@dataclass
class Row:
    """One benchmark row ready to train: the training step's parts (model, optimizer,
    pipeline, and the ordering)."""

    name: str
    step: StepParts
    spec: tuple  # build_row's (variant, pipeline, optimizer, method, unchecked)
    step_times: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in STAGES})
    peak_step_bytes: int | None = None  # None until measure_memory
    operators: dict[str, dict[str, int]] = field(default_factory=dict)
    profile: dict[str, dict] | None = None  # operator_times of its steps (not for ':graph')
    limits: dict[str, dict] = field(default_factory=dict)  # stage -> stage_limits' entry
    captured: CapturedStep | None = None  # a ``:graph`` row: its steps replay a capture
    cursor: EpochCursor | None = None  # the ordering's next batches (made by build_row)


def row_name(variant: str, pipeline: str, optimizer: str = "sgd") -> str:
    """``rr-classic``, ``mean``, ``rr+vr_momentum``: the row's name in the table and JSON."""
    name = variant_dir(variant, pipeline)
    return name if optimizer == "sgd" else f"{name}+{optimizer}"


def build_row(
    variant: str,
    pipeline: str,
    args,
    device: torch.device,
    optimizer="sgd",
    method=None,
    unchecked: bool = False,
) -> Row:
    """One row as a training job builds it: ``balance=<variant> pipeline=<pipeline>
    optimizer=<optimizer>`` composed from ``conf/`` (LeNet, seed 0, batch ``args.batch``) and
    built by the runner's :func:`~grab_exp.runner.training.build.build_parts` for an epoch of
    50,000 examples.

    ``method``: the per-sample method of a comparison row (named ``<row>@<method>``);
    ``unchecked``: a comparison row without the per-sample check (``pipeline.check_every=0``,
    named ``<row>@unchecked``).
    """
    overrides = [f"balance={variant}", f"pipeline={pipeline}", f"optimizer={optimizer}"]
    overrides += ["model=lenet", "seed=0", f"batch_size={args.batch}"]
    if pipeline != "classic":
        overrides.append(f"pipeline.method={method or args.method}")
    if unchecked:
        overrides.append("pipeline.check_every=0")
    step = build_parts(compose_config(overrides), EPOCH_EXAMPLES, Strategy(device))
    suffix = "unchecked" if unchecked else method
    name = row_name(variant, pipeline, optimizer) + (f"@{suffix}" if suffix else "")
    spec = (variant, pipeline, optimizer, method, unchecked)
    return Row(name, step, spec, cursor=EpochCursor(step.ordering, args.batch))


def build_rows(args, device: torch.device) -> list[Row]:
    """Table 1's rows (classic RR first: the ratios' base), the VRGD rows, Table 1's per-sample
    rows again with ``--compare``'s method (e.g. ``mean@hooks``: materialized), with
    ``--unchecked`` again without the per-sample check (``mean@unchecked``: the check's cost
    is the ratio of ``mean`` to it), then with
    ``--captured`` (``auto``: on CUDA) Table 1's rows captured (``mean:graph``)."""
    rows = [build_row(v, p, args, device) for v, p in ROWS]
    rows += [build_row(v, p, args, device, optimizer=o) for v, p, o in GSNR_ROWS]
    compared = [(v, p) for v, p in ROWS if p == "functional"] if args.compare else []
    rows += [build_row(v, p, args, device, method=args.compare) for v, p in compared]
    if args.unchecked:
        per_sample = [(v, p) for v, p in ROWS if p == "functional"]
        rows += [build_row(v, p, args, device, unchecked=True) for v, p in per_sample]
    captured = args.captured == "yes" or (args.captured == "auto" and device.type == "cuda")
    for variant, pipeline in ROWS if captured else ():
        row = build_row(variant, pipeline, args, device)
        row.name, row.captured = f"{row.name}:graph", capture_step(row.step)
        rows.append(row)
    return rows


def _timed_stages(row: Row, device: torch.device):
    def stage(name: str, fn):
        out, seconds = timed(fn, device)
        row.parts[name].append(seconds)
        return out

    return stage


def bench_step(row: Row, x: torch.Tensor, y: torch.Tensor, stage=untimed) -> None:
    """The training step of :mod:`grab_exp.runner.training.step` on the row's next batch positions
    (a ``:graph`` row's captured step; it times no stages).

    ``stage(name, fn)`` runs (and may time) each part. The fixed batch ``x``, ``y`` stands in
    for the examples at the ordering's next positions; past the end a new epoch starts.
    """
    indices = row.cursor.next()  # (B,)
    if row.captured is not None:
        row.captured(x, y, indices)
    else:
        train_step(row.step, x, y, indices, stage)


def time_rows(
    rows: list[Row], args, device: torch.device, after_repeat: Callable[[int], object] | None = None
) -> None:
    """Warm-up, then interleaved repeats of ``args.steps`` steps per row; ``after_repeat(k)``
    after the ``k``-th repeat."""
    x, y = make_batch(args.batch, device)
    for row in rows:
        for _ in range(args.warmup):
            bench_step(row, x, y)
    for repeat in range(1, args.repeats + 1):
        for row in rows:
            _, seconds = timed(
                lambda row=row: [bench_step(row, x, y) for _ in range(args.steps)], device
            )
            row.step_times.append(seconds / args.steps)
            if row.captured is None:
                bench_step(row, x, y, _timed_stages(row, device))
        if after_repeat is not None:
            after_repeat(repeat)


def measure_limits(rows: list[Row], args, device: torch.device) -> dict[str, float]:
    """The machine's rates (:func:`~grab_exp.bench.limits.machine_rates`, in this sitting) and
    each row's stage limits at them; returns the rates."""
    rates = machine_rates(device)
    x, y = make_batch(args.batch, device)
    for row in rows:
        row.limits = stage_limits(row.step, x, y, rates)
    return rates


def measure_memory(rows: list[Row], args, device: torch.device) -> None:
    """Each row's peak step memory, in steps of their own (never in the timed ones); a CUDA
    ``:graph`` row's is its capture's (a replay allocates nothing the counters see)."""
    x, y = make_batch(args.batch, device)
    for row in rows:
        peak = peak_step_bytes(lambda row=row: bench_step(row, x, y), device)
        if row.captured is not None and row.captured.step_peak_bytes is not None:
            peak = row.captured.step_peak_bytes
        row.peak_step_bytes = peak


def step_operators(row: Row, x: torch.Tensor, y: torch.Tensor, cuda_path: bool) -> dict:
    """The non-view aten operators of one training step of the row: ``total`` and per stage.

    ``cuda_path``: the step runs as on CUDA (:func:`~grab_exp.devices.graph_safe`: the sign
    recursions as kernels, not as the CPU's numpy loop, which dispatches no operators).
    """
    counts = {}

    def stage(name: str, fn):
        with OperatorCount() as counter:
            out = fn()
        counts[name] = counter.total
        return out

    with graph_safe() if cuda_path else contextlib.nullcontext():
        bench_step(row, x, y, stage)
    return {"total": sum(counts.values()), **counts}


def captured_operators(row: Row, args, x: torch.Tensor, y: torch.Tensor) -> dict[str, int]:
    """What a captured step of the row (``trainer.cuda_graph``) launches: ``per_step``, the
    input copies and the one graph launch of a replay (:class:`CapturedStep`), and ``kernels``,
    the non-view operators inside the graph: one step of a twin of the row (its own model and
    ordering) traced after an eager warm-up step (:class:`TracedStep`, CUDA's sign loop)."""
    variant, pipeline, optimizer, method, unchecked = row.spec
    twin = build_row(variant, pipeline, args, x.device, optimizer, method, unchecked)
    bench_step(twin, x, y)  # eager: what a step makes once
    twin.step.ordering.prepare_capture()
    indices = twin.cursor.next()  # (B,)
    traced = TracedStep(functools.partial(train_step, twin.step), (x, y, indices))
    return {"per_step": len((x, y, indices)) + 1, "kernels": traced.kernels}


def count_operators(rows: list[Row], args, device: torch.device) -> None:
    """Each row's operators per step (eager; with the CUDA sign loop; captured), outside the
    timing."""
    x, y = make_batch(args.batch, device)
    for row in rows:
        if row.captured is not None:  # its eager twin's counts are the row without ':graph'
            row.operators = {"captured": captured_operators(row, args, x, y)}
            continue
        row.operators = {
            "eager": step_operators(row, x, y, cuda_path=False),
            "cuda_path": step_operators(row, x, y, cuda_path=True),
            "captured": captured_operators(row, args, x, y),
        }


def profile_rows(rows: list[Row], args, device: torch.device) -> None:
    """Where each row's step spends its time (:func:`operator_times` of ``--profile-steps``
    steps), right after the timing and before anything else is built, each row after a garbage
    collection (the profiler's records of the row before must not be collected in its steps);
    a ``:graph`` row runs as one and is not profiled."""
    x, y = make_batch(args.batch, device)
    for row in rows:
        if row.captured is None and args.profile_steps:
            gc.collect()
            step = functools.partial(bench_step, row, x, y)  # step(stage)
            row.profile = operator_times(step, args.profile_steps)


def _median_ms(times: list[float]) -> float | None:
    return statistics.median(times) * 1e3 if times else None


def summarize(rows: list[Row], args, device: torch.device, rates: dict | None = None) -> dict:
    """Medians, per-epoch extrapolation, ratios to classic RR, memory; ``mean_step_ms``, the
    mean step over every timed repeat (what a rare costly step, such as the per-sample check's,
    adds on average: the median leaves it out); once measured, the machine's ``rates`` and each
    row's stage ``limits`` and ``limit_multiples`` (a stage's median over its limit).

    A stage a row does not run (``gsnr`` without a VRGD optimizer) has ``None`` as its median.
    """
    steps_per_epoch = math.ceil(EPOCH_EXAMPLES / args.batch)
    base = statistics.median(rows[0].step_times)
    results = []
    for row in rows:
        step = statistics.median(row.step_times)
        breakdown = {k: _median_ms(v) for k, v in row.parts.items()}
        results.append(
            {
                "row": row.name,
                "method": getattr(row.step.pipeline, "method", "classic"),
                "step_ms": step * 1e3,
                "mean_step_ms": statistics.mean(row.step_times) * 1e3,
                "epoch_s": step * steps_per_epoch,
                "ratio_to_classic_rr": step / base,
                "breakdown_ms": breakdown,
                "limits": row.limits,
                "limit_multiples": multiples(breakdown, row.limits),
                "ordering_state_bytes": row.step.ordering.state_bytes(),
                "peak_step_bytes": row.peak_step_bytes,
                "operators": row.operators,
                "profile": row.profile,
            }
        )
    settings = {"device": str(device), "epoch_examples": EPOCH_EXAMPLES}
    return bench_report(
        "epoch",
        args,
        device,
        settings,
        memory_method=memory_method(device),
        rates=rates,
        rows=results,
    )


def _cell(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:>{width}.2f}"


def _ops(row: dict, path: str, key: str = "total") -> str:
    return f"{row['operators'].get(path, {}).get(key, '-'):>8}"


def print_table(report: dict) -> None:
    """A readable table of the report's rows (``-``: a stage the row does not run)."""
    print(
        f"{'row':<20}{'step ms':>9}{'epoch s':>9}{'x classic':>10}{'grads':>8}{'gsnr':>7}"
        f"{'ordering':>9}{'opt':>7}{'state MB':>10}{'peak MB':>9}{'ops':>8}{'ops cuda':>8}"
        f"{'graph':>8}"
    )
    for r in report["rows"]:
        b, peak = r["breakdown_ms"], r["peak_step_bytes"]
        print(
            f"{r['row']:<20}{r['step_ms']:>9.2f}{r['epoch_s']:>9.1f}"
            f"{r['ratio_to_classic_rr']:>10.2f}{_cell(b['grads'], 8)}{_cell(b['gsnr'], 7)}"
            f"{_cell(b['ordering'], 9)}{_cell(b['opt'], 7)}"
            f"{r['ordering_state_bytes'] / 2**20:>10.2f}"
            f"{_cell(None if peak is None else peak / 2**20, 9)}"
            f"{_ops(r, 'eager')}{_ops(r, 'cuda_path')}{_ops(r, 'captured', 'kernels')}"
        )
    print(f"peak: {report['memory_method']}; graph: the kernels inside a captured step's graph")
    if report.get("rates"):
        print_limits(report)


def print_limits(report: dict) -> None:
    """Each row's stages against their limits: ``ms / limit ms = x multiple``."""
    rates = report["rates"]
    print(
        f"limits at {rates['stream_gb_s']:.1f} GB/s stream, {rates['matmul_gflop_s']:.1f} "
        "GFLOP/s matmul (measured in this sitting): stage ms / limit ms (x multiple)"
    )
    for r in report["rows"]:
        cells = []
        for stage, limit in r["limits"].items():
            ms, multiple = r["breakdown_ms"].get(stage), r["limit_multiples"].get(stage)
            if ms is None:
                continue
            times = "" if multiple is None else f" (x{multiple:.1f})"
            cells.append(f"{stage} {ms:.2f}/{limit['limit_ms']:.3f}{times}")
        print(f"{r['row']:<20}" + "  ".join(cells))


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m grab_exp.bench epoch``."""
    parser = bench_parser("epoch", __doc__)
    parser.add_argument("--batch", type=int, default=16, help="examples per step (B)")
    parser.add_argument("--steps", type=int, default=20, help="steps per timed repeat")
    parser.add_argument("--repeats", type=int, default=15, help="interleaved timed repeats")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps per row first")
    parser.add_argument(
        "--method", default="auto", help="per-sample gradients: func|hooks|factored|auto"
    )
    parser.add_argument(
        "--profile-steps",
        type=int,
        default=50,
        help="steps per row profiled for where the time goes (0: none)",
    )
    parser.add_argument("--compare", default="hooks", help="method of the @ rows ('': none)")
    parser.add_argument(
        "--unchecked",
        action="store_true",
        help="time Table 1's per-sample rows without the per-sample check too (@unchecked)",
    )
    parser.add_argument(
        "--captured",
        choices=("auto", "yes", "no"),
        default="auto",
        help="time Table 1's rows captured too (the :graph rows; auto: on CUDA)",
    )
    add_device_option(parser)
    return parser


def main(argv: list[str] | None = None) -> dict:
    """Run the benchmark, print the table, write the JSON."""
    args = build_parser().parse_args(argv)
    check_int_at_least("--profile-steps", args.profile_steps, 0)
    device = torch.device(args.device)
    set_cuda_policy(device, tf32=False)  # the numerics of a training run (trainer.tf32=false)
    rows = build_rows(args, device)
    done: list[str] = []

    rates = None

    def save(stage: str) -> dict:  # the file holds what is measured so far, at every stage
        done.append(stage)
        report = {**summarize(rows, args, device, rates), "done": list(done)}
        report["complete"] = stage == "operators"
        write_report(args.out, report)
        return report

    time_rows(rows, args, device, lambda k: save(f"timing {k}/{args.repeats}"))
    rates = measure_limits(rows, args, device)
    save("limits")
    profile_rows(rows, args, device)
    save("profile")
    measure_memory(rows, args, device)
    save("memory")
    count_operators(rows, args, device)
    report = save("operators")
    print_table(report)
    return report
