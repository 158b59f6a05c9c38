"""The VRGD large-batch comparison (issue 7): runs of ``experiment=vrgd_large_batch`` -> table.

Each run is identified by its arm (conf/arm/: ``sgd_momentum``, ``vr_momentum``, ``adam``,
``vr_adam``), batch size and seed, from :func:`grab_exp.report.collect.run_identity`, and its
learning rate is read from its resolved config. Time is the training time only: the cumulative
``time/epoch_s`` (evaluation excluded), so "time to target" is the training time until the end
of the first epoch whose test accuracy reaches the target.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import pandas as pd

from grab_exp.report.collect import read_config, read_runs
from grab_exp.report.frames import RunLoadError, warn_skip

ARMS = ("sgd_momentum", "vr_momentum", "adam", "vr_adam")
ARM_LABELS = {
    "sgd_momentum": "SGD-momentum",
    "vr_momentum": "VR-Momentum",
    "adam": "Adam",
    "vr_adam": "VR-Adam",
}
DEFAULT_TARGETS = (0.25, 0.45)


def learning_rate(run_dir: str | os.PathLike[str]) -> float:
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


def load_vrgd_runs(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """One row per (run, epoch) with ``arm``, ``batch_size``, ``lr``, ``seed`` and the metrics.

    Unfinished or unreadable runs, and runs not of an arm (conf/arm/), are skipped with a
    ``ReportWarning`` naming them.
    """
    frames = []
    for frame, identity in read_runs(paths):
        run_dir = frame["run"].iloc[0]
        try:
            if identity["arm"] is None or identity["batch_size"] is None:
                raise RunLoadError(f"skipping {run_dir}: not a run of an arm (conf/arm/)")
            settings = {"arm": str(identity["arm"]), "batch_size": int(identity["batch_size"])}
            frames.append(frame.assign(**settings, lr=learning_rate(run_dir)))
        except RunLoadError as error:
            warn_skip(str(error))
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True)
    frame["train_time_s"] = frame.groupby("run")["time/epoch_s"].cumsum()
    return frame.sort_values(["arm", "batch_size", "seed", "epoch"], ignore_index=True)


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
    table["arm_rank"] = table["arm"].map({arm: i for i, arm in enumerate(ARMS)})
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
            "Optimizer": table["arm"].map(ARM_LABELS).fillna(table["arm"]),
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
