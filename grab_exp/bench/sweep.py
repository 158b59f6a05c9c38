"""Sweep throughput: ``table1`` jobs as one Hydra multirun with the joblib launcher.

For every setting ``NxT`` (N jobs at once, T threads per job) the same jobs run as
``python -m grab_exp -m experiment=table1 hydra/launcher=joblib_local hydra.launcher.n_jobs=N``
with ``OMP_NUM_THREADS=T`` in the multirun's environment, into a fresh temporary sweep folder;
the wall time of the whole multirun gives jobs per hour and the speed-up over the sequential
setting (the first with N = 1). On a GPU every job uses the one GPU, so N is jobs per GPU.

Threads: joblib's loky backend starts its workers with ``OMP_NUM_THREADS`` (and the MKL/OpenBLAS
variables) set to the parent's value when the parent has one, else to ``cpu_count() // N``
(``joblib._parallel_backends``, ``_prepare_worker_env``); with N = 1 the jobs run in the
multirun's own process. torch sizes its intra-op pool from ``OMP_NUM_THREADS``. A Hydra callback
(:class:`RecordThreads`) records ``torch.get_num_threads()`` and the pid inside every job, so the
JSON shows the threads and processes the jobs really had.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from hydra.experimental.callback import Callback

from grab_exp.bench.machine import bench_parser, bench_report, write_report
from grab_exp.report.collect import METRICS_FILE, read_metrics

REPO_ROOT = Path(__file__).resolve().parents[2]
THREADS_FILE = "bench_threads.json"
LOSS_COLUMNS = ("train/loss", "test/loss", "train/running_loss")
FULL = {"settings": "1x2,2x1,4x1", "rows": "rr_classic,rr,mean,recursive", "seeds": "0,7,42"}
QUICK = {"settings": "1x1,2x1", "rows": "rr,mean", "seeds": "0,7"}
QUICK_OVERRIDES = ("dataset=synthetic", "dataset.num_train=256", "dataset.num_test=64")


@dataclass(frozen=True)
class Setting:
    """``jobs`` jobs at once (joblib's ``n_jobs``), ``threads`` intra-op threads per job."""

    jobs: int
    threads: int

    @classmethod
    def parse(cls, text: str) -> Setting:
        """``"2x1"`` -> ``Setting(jobs=2, threads=1)``."""
        jobs, _, threads = text.strip().partition("x")
        if not (jobs.isdigit() and threads.isdigit() and int(jobs) > 0 and int(threads) > 0):
            raise SystemExit(f"error: --settings: got {text!r}; allowed: JOBSxTHREADS, e.g. 2x1")
        return cls(int(jobs), int(threads))

    @property
    def label(self) -> str:
        """The setting as written on the command line."""
        return f"{self.jobs}x{self.threads}"


class RecordThreads(Callback):
    """Hydra callback: writes the job's pid and torch thread count into its run directory."""

    def on_job_start(self, config, **kwargs: Any) -> None:
        """Runs inside the job's process (a loky worker when N > 1), before the task."""
        record = {"pid": os.getpid(), "torch_threads": torch.get_num_threads()}
        (Path(config.hydra.runtime.output_dir) / THREADS_FILE).write_text(json.dumps(record))


def sweep_command(jobs: int | str, sweep_dir: str, args) -> list[str]:
    """The multirun of one setting: ``table1``'s chosen rows and seeds, joblib with ``jobs``."""
    return [
        sys.executable,
        "-m",
        "grab_exp",
        "-m",
        "experiment=table1",
        f"row={args.rows}",
        f"seed={args.seeds}",
        f"epochs={args.epochs}",
        "progress=none",
        "hydra/launcher=joblib_local",
        f"hydra.launcher.n_jobs={jobs}",
        f"hydra.sweep.dir={sweep_dir}",
        f"+hydra.callbacks.bench_threads._target_={__name__}.RecordThreads",
        *args.override,
    ]


def command_template(args) -> str:
    """The command of every setting, N and T left as letters (the JSON's record)."""
    command = sweep_command("N", "<fresh temporary folder>", args)
    return " ".join(["OMP_NUM_THREADS=T MKL_NUM_THREADS=T python", *command[1:]])


def sweep_env(setting: Setting) -> dict[str, str]:
    """The multirun's environment: T threads per job, no W&B."""
    threads = str(setting.threads)
    env = {**os.environ, "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    return {**env, "WANDB_MODE": "disabled"}


def collect_jobs(sweep_dir: Path) -> dict[str, dict[str, Any]]:
    """Every finished job under ``sweep_dir``: pid, torch threads, losses and seconds per epoch."""
    jobs = {}
    for run_dir in sorted(path.parent for path in sweep_dir.rglob(METRICS_FILE)):
        metrics = read_metrics(run_dir)  # one row per epoch
        record = json.loads((run_dir / THREADS_FILE).read_text())
        losses = metrics[list(LOSS_COLUMNS)].to_numpy().ravel().tolist()  # epoch by epoch
        record.update(losses=losses, epoch_s=metrics["time/epoch_s"].tolist())
        jobs[run_dir.relative_to(sweep_dir).as_posix()] = record
    return jobs


def run_setting(setting: Setting, args) -> tuple[float, dict[str, dict[str, Any]]]:
    """Run the multirun of ``setting`` in a fresh folder; its wall seconds and its jobs.

    The folder is temporary, or ``<args.keep>/<setting>`` (kept) when ``--keep`` is given.
    """
    if args.keep is None:
        with tempfile.TemporaryDirectory(prefix="grab_sweep_") as sweep_dir:
            return _run_in(setting, Path(sweep_dir), args)
    sweep_dir = Path(args.keep).resolve() / setting.label
    if sweep_dir.exists() and any(sweep_dir.iterdir()):
        raise SystemExit(f"error: --keep: {sweep_dir} is not empty (its jobs would be skipped)")
    return _run_in(setting, sweep_dir, args)


def _run_in(setting: Setting, sweep_dir: Path, args) -> tuple[float, dict[str, dict[str, Any]]]:
    command = sweep_command(setting.jobs, str(sweep_dir), args)
    started = time.perf_counter()
    done = subprocess.run(
        command, cwd=REPO_ROOT, env=sweep_env(setting), capture_output=True, text=True
    )
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-20:])
        raise SystemExit(f"error: setting {setting.label} failed:\n{' '.join(command)}\n{tail}")
    return seconds, collect_jobs(sweep_dir)


def _max_loss_diff(jobs: dict, base: dict) -> float:
    return max(
        abs(a - b)
        for name in base
        for a, b in zip(jobs[name]["losses"], base[name]["losses"], strict=True)
    )


def summarize(settings: list[Setting], runs: list[tuple[float, dict]]) -> list[dict]:
    """Jobs per hour, speed-up and loss differences against the sequential setting."""
    base = next((i for i, s in enumerate(settings) if s.jobs == 1), 0)
    base_seconds, base_jobs = runs[base]
    results = []
    for setting, (seconds, jobs) in zip(settings, runs, strict=True):
        if set(jobs) != set(base_jobs):
            raise SystemExit(f"error: setting {setting.label} did not finish the same jobs")
        results.append(
            {
                "setting": setting.label,
                "n_jobs": setting.jobs,
                "threads_per_job": setting.threads,
                "jobs": len(jobs),
                "wall_s": seconds,
                "jobs_per_hour": len(jobs) * 3600 / seconds,
                "speedup_vs_sequential": base_seconds / seconds,
                "median_epoch_s": statistics.median(t for j in jobs.values() for t in j["epoch_s"]),
                "torch_threads_seen": sorted({j["torch_threads"] for j in jobs.values()}),
                "processes": len({j["pid"] for j in jobs.values()}),
                "max_abs_loss_diff_vs_sequential": _max_loss_diff(jobs, base_jobs),
            }
        )
    return results


def warm_data_cache() -> None:
    """Decode the CIFAR-10 archive into its cache now, so that no setting pays for it."""
    from grab_exp.data.cifar10_jpeg import DEFAULT_ARCHIVE, load_or_decode, resolve_archive
    from grab_exp.data.paths import resolve_cache_dir

    load_or_decode(resolve_archive(DEFAULT_ARCHIVE), resolve_cache_dir(None))


def print_table(report: dict) -> None:
    """A readable table of the settings."""
    print(
        f"{'setting':<9}{'jobs':>6}{'wall s':>9}{'jobs/h':>9}{'speed-up':>10}{'epoch s':>9}"
        f"{'threads':>9}{'procs':>7}{'max |dloss|':>13}"
    )
    for r in report["results"]:
        print(
            f"{r['setting']:<9}{r['jobs']:>6}{r['wall_s']:>9.1f}{r['jobs_per_hour']:>9.1f}"
            f"{r['speedup_vs_sequential']:>10.2f}{r['median_epoch_s']:>9.2f}"
            f"{r['torch_threads_seen']!s:>9}"
            f"{r['processes']:>7}{r['max_abs_loss_diff_vs_sequential']:>13.2e}"
        )


def build_parser() -> argparse.ArgumentParser:
    """The options of ``python -m grab_exp.bench sweep``."""
    parser = bench_parser("sweep", __doc__)
    parser.add_argument("--settings", help=f"JOBSxTHREADS,... (default {FULL['settings']})")
    parser.add_argument("--rows", help=f"table1 rows (default {FULL['rows']})")
    parser.add_argument("--seeds", help=f"seeds (default {FULL['seeds']})")
    parser.add_argument("--epochs", type=int, default=1, help="epochs of every job")
    parser.add_argument("--override", action="append", default=[], help="extra Hydra override")
    parser.add_argument("--quick", action="store_true", help="synthetic data, 4 tiny jobs")
    parser.add_argument("--keep", help="keep each setting's run folders in KEEP/<setting>")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Options; ``--quick`` fills the unset ones from :data:`QUICK` (synthetic data)."""
    args = build_parser().parse_args(argv)
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.quick:
        args.override = [*QUICK_OVERRIDES, *args.override]
    return args


def main(argv: list[str] | None = None) -> dict:
    """Run every setting, print the table, write the JSON."""
    args = parse_args(argv)
    settings = [Setting.parse(text) for text in args.settings.split(",")]
    if not args.quick:
        warm_data_cache()
    runs = [run_setting(setting, args) for setting in settings]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    command = {"command": command_template(args)}
    report = bench_report("sweep", args, device, command, results=summarize(settings, runs))
    print_table(report)
    write_report(args.out, report)
    return report
