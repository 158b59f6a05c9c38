"""``python -m grab_exp.report vrgd RUNS... --out DIR``: the VRGD table and figure.

Writes ``vrgd_table.{csv,md}`` (mean over seeds per batch size and optimizer), ``vrgd_runs.csv``
(one row per run) and ``vrgd_figure.{png,pdf}`` (test accuracy against epochs and against
training time, one column per batch size). ``--archive DIR`` first copies every run's light
files (``metrics.csv``, ``summary.json``, ``.hydra/``) there, keeping their relative paths.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from grab_exp.logging.files import shown, without_run_cwd
from grab_exp.report.collect import find_run_dirs
from grab_exp.report.figures import STYLE, save_figure
from grab_exp.report.render import to_markdown
from grab_exp.report.vrgd import (
    ARM_LABELS,
    ARMS,
    DEFAULT_TARGETS,
    add_bench_times,
    display_table,
    load_vrgd_runs,
    per_run,
    summarize,
)

ARM_STYLE = {  # one color per optimizer family; the VR arm dashed
    "sgd_momentum": ("tab:blue", "-"),
    "vr_momentum": ("tab:blue", "--"),
    "adam": ("tab:orange", "-"),
    "vr_adam": ("tab:orange", "--"),
}
HYDRA_FILES = tuple(f".hydra/{name}.yaml" for name in ("config", "hydra", "overrides"))
LIGHT_FILES = ("metrics.csv", "summary.json", *HYDRA_FILES)


def figure(
    frame: pd.DataFrame, targets: tuple[float, ...], bench: dict | None = None, source: str = ""
) -> Figure:
    """Test accuracy (mean over seeds) per epoch (top) and per training second (bottom).

    With ``bench`` (a ``python -m grab_exp.bench vrgd`` JSON, file ``source``) the seconds are
    epochs x the arm's idle-machine epoch time; without it, the jobs' own times (load included).
    """
    batches = sorted(frame["batch_size"].unique())
    idle = {(r["arm"], r["batch_size"]): r["epoch_s"] for r in (bench or {}).get("rows", [])}
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(2.3 * len(batches), 3.8), layout="constrained")
        axes = fig.subplots(2, len(batches), squeeze=False, sharey=True)
        for col, batch in enumerate(batches):
            runs = frame[frame["batch_size"] == batch]
            curves = runs.groupby(["arm", "epoch"])[["test/acc", "train_time_s"]].mean()
            for arm in [a for a in ARMS if a in curves.index.get_level_values(0)]:
                color, style = ARM_STYLE[arm]
                curve = curves.loc[arm]
                kw = {"color": color, "linestyle": style, "label": ARM_LABELS[arm], "marker": "."}
                seconds = curve.index * idle[arm, batch] if idle else curve["train_time_s"]
                axes[0, col].plot(curve.index, 100 * curve["test/acc"], **kw)
                axes[1, col].plot(seconds, 100 * curve["test/acc"], **kw)
            axes[0, col].set_title(f"batch {batch}")
            axes[0, col].set_xlabel("epoch")
            axes[1, col].set_xlabel("training time, idle machine (s)" if idle else
                                    "training time during the runs (s)")  # fmt: skip
            for ax in axes[:, col]:
                for target in targets:
                    ax.axhline(100 * target, color="0.7", linewidth=0.5, linestyle=":")
        for ax in axes[:, 0]:
            ax.set_ylabel("test accuracy (%)")
        axes[0, 0].legend(frameon=False)
        fig.suptitle(
            f"mean over seeds; bottom: epochs x idle-machine epoch time ({source})"
            if idle else "mean over seeds; bottom: the jobs' own times, machine load included",
            fontsize=6,
        )  # fmt: skip
    return fig


def archive_runs(paths: list[str], archive: Path) -> None:
    """Copy each run's light files to ``archive/<path relative to its sweep root>``.

    ``hydra.yaml`` is copied with the job's working directory made relative.
    """
    for root in map(Path, paths):
        for run_dir in find_run_dirs([root]):
            relative = run_dir.relative_to(root.resolve())
            for name in LIGHT_FILES:
                source = run_dir / name
                if source.is_file():
                    target = archive / relative / name
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, target)
                    if target.name == "hydra.yaml":  # no folder of this machine in the archive
                        target.write_text(without_run_cwd(target.read_text()))


def write_report(
    paths: list[str], out: Path, targets: tuple[float, ...], bench: Path | None = None
) -> list[Path]:
    """Collect the runs under ``paths`` and write the table and figure under ``out``.

    Args:
        paths: Sweep or run directories.
        out: The output folder (created).
        targets: Test accuracies (fractions) to time.
        bench: A ``python -m grab_exp.bench vrgd`` JSON adding idle-machine epoch times.

    Returns:
        The written paths.

    Raises:
        ValueError: no finished run of an arm under ``paths``.
    """
    frame = load_vrgd_runs(paths)
    if frame.empty:
        raise ValueError("no finished runs of an arm (conf/arm/) under the paths")
    runs = per_run(frame, targets)
    table = summarize(runs, targets)
    bench_data = json.loads(bench.read_text()) if bench is not None else None
    if bench_data is not None:
        table = add_bench_times(table, bench_data, targets)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "vrgd_runs.csv", out / "vrgd_table.csv", out / "vrgd_table.md"]
    runs.to_csv(written[0], index=False)
    table.to_csv(written[1], index=False)
    written[2].write_text(to_markdown(display_table(table, targets)))
    source = shown(bench) if bench is not None else ""
    written += save_figure(figure(frame, targets, bench_data, source), out, "vrgd_figure")
    return written


def fraction(text: str) -> float:
    """A ``--targets`` value: a test accuracy as a fraction in (0, 1)."""
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"each must be a fraction in (0, 1); got {text}")
    return value


def add_arguments(cli: argparse.ArgumentParser) -> None:
    """The options of ``python -m grab_exp.report vrgd``."""
    cli.add_argument("paths", nargs="+", help="sweep or run directories")
    cli.add_argument("--out", required=True, type=Path, help="where the table and figure go")
    cli.add_argument("--archive", type=Path, help="copy the runs' light files here first")
    cli.add_argument("--bench", type=Path, help="JSON of python -m grab_exp.bench vrgd")
    cli.add_argument(
        "--targets", type=fraction, nargs="+", default=list(DEFAULT_TARGETS),
        help="test accuracies (fractions) to time (default: %(default)s)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Optionally archive the runs, then write the report; 1 when there is no run of an arm."""
    if args.archive:
        archive_runs(args.paths, args.archive)
    try:
        written = write_report(args.paths, args.out, tuple(args.targets), args.bench)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    for path in written:
        print(path)
    return 0
