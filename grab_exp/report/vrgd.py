"""``python -m grab_exp.report vrgd RUNS... --out DIR``: the VRGD large-batch comparison (runs of
``experiment=vrgd_large_batch``) as a table and a figure.

Each run is identified by its arm (``conf/arm/``: ``sgd_momentum``, ``vr_momentum``, ``adam``,
``vr_adam``; any other arm is shown after them under its own name), batch size and seed, from its
identity; its learning rate is read from its resolved config. Time is the training time only: the
cumulative ``time/epoch_s`` (evaluation excluded), so "time to target" is the training time until
the end of the first epoch whose test accuracy reaches the target.

Writes ``vrgd_table.{csv,md}`` (mean over seeds per batch size and optimizer), ``vrgd_runs.csv``
(one row per run) and ``vrgd_figure.{png,pdf}`` (test accuracy against epochs and against
training time, one column per batch size). ``--archive DIR`` first copies every run's light
files (``metrics.csv``, ``summary.json``, ``.hydra/``) there, keeping their relative paths.
"""

from __future__ import annotations

import argparse
import json
import shutil
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.figure import Figure

from grab_exp.logging.files import shown, without_run_cwd
from grab_exp.report.collect import METRICS_FILE, SUMMARY_FILE, find_run_dirs, read_runs
from grab_exp.report.frames import RunLoadError, warn_skip
from grab_exp.report.render import STYLE, save_figure, to_markdown
from grab_exp.runner.rundir.identity import read_config

#: arm -> (label, color, line style), in the tables' order: one color per optimizer family, the
#: VR arm dashed; any other arm is shown under its own name, gray and dash-dotted
ARMS = {
    "sgd_momentum": ("SGD-momentum", "tab:blue", "-"),
    "vr_momentum": ("VR-Momentum", "tab:blue", "--"),
    "adam": ("Adam", "tab:orange", "-"),
    "vr_adam": ("VR-Adam", "tab:orange", "--"),
}
DEFAULT_TARGETS = (0.25, 0.45)
HYDRA_FILES = tuple(f".hydra/{name}.yaml" for name in ("config", "hydra", "overrides"))
LIGHT_FILES = (METRICS_FILE, SUMMARY_FILE, *HYDRA_FILES)


@dataclass
class Report:
    """What :func:`compute` makes of the runs (see :func:`per_run` and :func:`summarize`)."""

    frame: pd.DataFrame
    runs: pd.DataFrame
    table: pd.DataFrame
    targets: tuple[float, ...]
    bench: dict | None  # the ``python -m grab_exp.bench vrgd`` JSON
    bench_source: str  # its file, as the figure cites it


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


def load(args: argparse.Namespace) -> pd.DataFrame:
    """One row per (run, epoch) of the runs under ``args.paths``: the tidy frame's columns, then
    ``arm``, ``batch_size``, ``lr`` and ``train_time_s`` (cumulative ``time/epoch_s``).

    Unfinished or unreadable runs, and runs not of an arm (conf/arm/), are skipped with a
    ``ReportWarning`` naming them.

    Raises:
        ValueError: no finished run of an arm.
    """
    frames = []
    for frame, identity in read_runs(args.paths):
        run_dir = frame["run"].iloc[0]
        try:
            if identity["arm"] is None or identity["batch_size"] is None:
                raise RunLoadError(f"skipping {run_dir}: not a run of an arm (conf/arm/)")
            settings = {"arm": str(identity["arm"]), "batch_size": int(identity["batch_size"])}
            frames.append(frame.assign(**settings, lr=learning_rate(run_dir)))
        except RunLoadError as error:
            warn_skip(str(error))
    if not frames:
        raise ValueError("no finished runs of an arm (conf/arm/) under the paths")
    frame = pd.concat(frames, ignore_index=True)
    frame["train_time_s"] = frame.groupby("run")["time/epoch_s"].cumsum()
    return frame.sort_values(["arm", "batch_size", "seed", "epoch"], ignore_index=True)


def compute(frame: pd.DataFrame, args: argparse.Namespace) -> Report:
    """Per run and per (batch size, arm), with idle-machine times when ``args.bench`` is given."""
    targets = tuple(args.targets)
    runs = per_run(frame, targets)
    table = summarize(runs, targets)
    bench = json.loads(Path(args.bench).read_text()) if args.bench is not None else None
    if bench is not None:
        table = add_bench_times(table, bench, targets)
    source = shown(args.bench) if args.bench is not None else ""
    return Report(frame, runs, table, targets, bench, source)


def write(report: Report, args: argparse.Namespace) -> list[Path]:
    """Write the files of the module docstring under ``args.out`` (created); returns them."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "vrgd_runs.csv", out / "vrgd_table.csv", out / "vrgd_table.md"]
    report.runs.to_csv(written[0], index=False)
    report.table.to_csv(written[1], index=False)
    written[2].write_text(to_markdown(display_table(report.table, report.targets)))
    return written + save_figure(figure(report), out, "vrgd_figure")


def run(args: argparse.Namespace) -> int:
    """Archive the runs if asked, then load, compute and write; print the written files."""
    if args.archive:
        archive_runs(args.paths, args.archive)
    for path in write(compute(load(args), args), args):
        print(path)
    return 0


def arm_rank(arm: str) -> tuple[int, str]:
    """Sort key: the arms of :data:`ARMS` in their order, any others after, by name."""
    return (list(ARMS).index(arm), "") if arm in ARMS else (len(ARMS), arm)


def learning_rate(run_dir: str) -> float:
    """The run's ``optimizer.lr``, from its resolved config.

    Raises:
        RunLoadError: the run has no readable ``.hydra/config.yaml`` with an ``optimizer.lr``.
    """
    try:
        return float(read_config(run_dir)["optimizer"]["lr"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RunLoadError(
            f"skipping {run_dir}: no optimizer.lr in its Hydra config ({error})"
        ) from None


def time_to_target(run: pd.DataFrame, target: float) -> tuple[float, float]:
    """``(epochs, train seconds)`` until ``test/acc >= target`` first holds; NaN if never."""
    reached = run[run["test/acc"] >= target]
    if reached.empty:
        return float("nan"), float("nan")
    first = reached.iloc[0]
    return float(first["epoch"]), float(first["train_time_s"])


def per_run(frame: pd.DataFrame, targets: Iterable[float]) -> pd.DataFrame:
    """One row per run: final and best test accuracy, time per epoch, time to each target."""
    rows = []
    for (arm, batch, seed), run in frame.groupby(["arm", "batch_size", "seed"]):
        last = run.iloc[-1]
        row = {
            "arm": arm,
            "batch_size": batch,
            "seed": seed,
            "lr": last["lr"],
            "epochs": int(last["epoch"]),
            "final_test_acc": last["test/acc"],
            "best_test_acc": run["test/acc"].max(),
            "final_train_loss": last["train/loss"],
            "epoch_s": run["time/epoch_s"].median(),
        }
        for target in targets:
            epochs, seconds = time_to_target(run, target)
            row[f"epochs_to_{target:g}"], row[f"time_to_{target:g}_s"] = epochs, seconds
        rows.append(row)
    return pd.DataFrame(rows)


def summarize(runs: pd.DataFrame, targets: Iterable[float]) -> pd.DataFrame:
    """Mean (and std) over seeds per (arm, batch size); ``reached_<t>`` counts the seeds."""
    targets = list(targets)
    grouped = runs.groupby(["batch_size", "arm"])
    table = grouped.agg(
        seeds=("seed", "count"),
        lr=("lr", "first"),
        final_test_acc_mean=("final_test_acc", "mean"),
        final_test_acc_std=("final_test_acc", "std"),
        best_test_acc_mean=("best_test_acc", "mean"),
        final_train_loss_mean=("final_train_loss", "mean"),
        epoch_s_mean=("epoch_s", "mean"),
    )
    for target in targets:
        key = f"{target:g}"
        table[f"reached_{key}"] = grouped[f"time_to_{key}_s"].count()
        table[f"epochs_to_{key}_mean"] = grouped[f"epochs_to_{key}"].mean()
        table[f"time_to_{key}_s_mean"] = grouped[f"time_to_{key}_s"].mean()
    table = table.reset_index()
    table["arm_rank"] = table["arm"].map(arm_rank)
    table = table.sort_values(["batch_size", "arm_rank"]).drop(columns="arm_rank")
    return table.reset_index(drop=True)


def add_bench_times(table: pd.DataFrame, bench: dict, targets: Iterable[float]) -> pd.DataFrame:
    """Add ``bench_epoch_s`` and ``bench_time_to_<t>_s`` from ``python -m grab_exp.bench vrgd``.

    ``bench_time_to_<t>_s`` is the mean number of epochs to the target (over the seeds that
    reach it) times the arm's epoch time measured by the bench on an idle machine: the time
    to target without the load that other jobs put on the machine during the sweep.
    """
    speeds = pd.DataFrame(bench["rows"])[["arm", "batch_size", "epoch_s"]]
    merged = table.merge(speeds.rename(columns={"epoch_s": "bench_epoch_s"}), how="left")
    for target in targets:
        key = f"{target:g}"
        merged[f"bench_time_to_{key}_s"] = merged[f"epochs_to_{key}_mean"] * merged["bench_epoch_s"]
    return merged


def display_table(table: pd.DataFrame, targets: Iterable[float]) -> pd.DataFrame:
    """The summary as strings for Markdown: accuracy in %, times in s, reached counts."""
    shown = pd.DataFrame(
        {
            "Batch": table["batch_size"].astype(str),
            "Optimizer": [ARMS[arm][0] if arm in ARMS else arm for arm in table["arm"]],
            "lr": table["lr"].map(lambda v: f"{v:.4g}"),
            "Seeds": table["seeds"].astype(str),
            "Final test acc. (%)": [
                f"{100 * m:.2f} ± {100 * s:.2f}"
                for m, s in table[["final_test_acc_mean", "final_test_acc_std"]].itertuples(
                    index=False
                )
            ],
            "Best test acc. (%)": table["best_test_acc_mean"].map(lambda v: f"{100 * v:.2f}"),
            "Epoch time (s)": table["epoch_s_mean"].map(lambda v: f"{v:.1f}"),
        }
    )
    if "bench_epoch_s" in table:
        shown["Epoch time, idle (s)"] = table["bench_epoch_s"].map(lambda v: f"{v:.1f}")
    for target in targets:
        key, pct = f"{target:g}", f"{100 * target:g}%"
        shown[f"Epochs to {pct}"] = _reached_column(table, f"epochs_to_{key}_mean", key, "{:.1f}")
        shown[f"Time to {pct} (s)"] = _reached_column(table, f"time_to_{key}_s_mean", key)
        if "bench_epoch_s" in table:
            idle = _reached_column(table, f"bench_time_to_{key}_s", key)
            shown[f"Time to {pct}, idle (s)"] = idle
    return shown


def _reached_column(table: pd.DataFrame, column: str, key: str, form: str = "{:.0f}") -> list[str]:
    """``column`` formatted, with how many seeds reached target ``key`` when not all did."""
    cells = []
    for value, reached, seeds in table[[column, f"reached_{key}", "seeds"]].itertuples(index=False):
        cell = "not reached" if reached == 0 else form.format(value)
        cells.append(cell if reached in (0, seeds) else f"{cell} ({reached}/{seeds} seeds)")
    return cells


def figure(report: Report) -> Figure:
    """Test accuracy (mean over seeds) per epoch (top) and per training second (bottom).

    With a bench (``python -m grab_exp.bench vrgd``) the seconds are epochs x the arm's
    idle-machine epoch time; without it, the jobs' own times (machine load included).
    """
    frame, idle = report.frame, report.bench is not None
    batches = sorted(frame["batch_size"].unique())
    epoch_s = {
        (r["arm"], r["batch_size"]): r["epoch_s"] for r in (report.bench or {}).get("rows", [])
    }
    arms = sorted(set(frame["arm"]), key=arm_rank)
    with mpl.rc_context(STYLE):
        fig = Figure(figsize=(2.3 * len(batches), 3.8), layout="constrained")
        axes = fig.subplots(2, len(batches), squeeze=False, sharey=True)
        for col, batch in enumerate(batches):
            runs = frame[frame["batch_size"] == batch]
            curves = runs.groupby(["arm", "epoch"])[["test/acc", "train_time_s"]].mean()
            for arm in [a for a in arms if a in curves.index.get_level_values(0)]:
                label, color, style = ARMS.get(arm, (arm, "tab:gray", "-."))
                curve = curves.loc[arm]
                kw = {"color": color, "linestyle": style, "label": label}
                seconds = (
                    curve.index * epoch_s.get((arm, batch), float("nan"))
                    if idle
                    else curve["train_time_s"]
                )
                axes[0, col].plot(curve.index, 100 * curve["test/acc"], marker=".", **kw)
                axes[1, col].plot(seconds, 100 * curve["test/acc"], marker=".", **kw)
            axes[0, col].set_title(f"batch {batch}")
            axes[0, col].set_xlabel("epoch")
            axes[1, col].set_xlabel("training time, idle machine (s)" if idle else
                                    "training time during the runs (s)")  # fmt: skip
            for ax in axes[:, col]:
                for target in report.targets:
                    ax.axhline(100 * target, color="0.7", linewidth=0.5, linestyle=":")
        for ax in axes[:, 0]:
            ax.set_ylabel("test accuracy (%)")
        axes[0, 0].legend(frameon=False)
        fig.suptitle(
            f"mean over seeds; bottom: epochs x idle-machine epoch time ({report.bench_source})"
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
