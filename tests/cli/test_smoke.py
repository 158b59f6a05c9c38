"""End to end: ``python -m grab_exp`` from a fresh working directory (its entry point run in this
process: only the run's files are checked).

* ``experiment=smoke`` (synthetic data, LeNet, mean balance, 2 epochs) finishes, in the
  directory its config names, with its identity in the summary;
* (slow) LeNet with mean balance on a 10,000-image stratified subset of the real CIFAR-10
  archive, 2 epochs, reaches a test accuracy above 25%.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
from support.grab_run import ARCHIVE, cli_env, needs_archive, run_in_process

MIN_TEST_ACC = 0.25


def only_run_dir(cwd: Path) -> Path:
    """The one run directory the command wrote (the one holding ``summary.json``)."""
    summaries = sorted((cwd / "outputs").rglob("summary.json"))
    assert len(summaries) == 1, f"expected one run, found {summaries}"
    return summaries[0].parent


def finished_run(cwd: Path, epochs: int) -> dict:
    """``summary.json`` of the run in ``cwd``, checked finished with ``epochs`` metric rows."""
    run_dir = only_run_dir(cwd)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished", summary
    with open(run_dir / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert [int(row["epoch"]) for row in rows] == list(range(1, epochs + 1))  # 1-based
    assert (run_dir / "checkpoint.pt").is_file()
    assert (run_dir / ".hydra" / "config.yaml").is_file()
    assert summary["final"]["epoch"] == epochs
    return summary


def test_smoke_experiment_finishes(grab_here, tmp_path, smoke_config):
    result = grab_here(["experiment=smoke", "progress=line"])
    assert result.returncode == 0, result.stdout[-3000:]
    summary = finished_run(tmp_path, epochs=smoke_config.epochs)
    assert only_run_dir(tmp_path) == tmp_path / "outputs" / "smoke" / "mean" / "seed0"
    assert summary["variant"] == "mean" and summary["pipeline"] == "functional"
    identity = summary["identity"]
    assert (identity["experiment"], identity["variant"], identity["seed"]) == ("smoke", "mean", 0)
    assert identity["world_size"] == 1 and identity["overrides_hash"] == ""
    assert 0.0 <= summary["final"]["test/acc"] <= 1.0


@pytest.mark.slow
@needs_archive
def test_lenet_mean_balance_learns_cifar10_subset(tmp_path):
    """The report's setup (SGD momentum 0.9, wd 0.01, batch 16) on the real data, lr 0.01.

    With the report's lr 0.001, 2 epochs of 625 steps are still in the slow start (about 20%
    test accuracy, for random reshuffling as for mean balance); lr 0.01 gets about 36%.
    """
    assert ARCHIVE.is_file()
    args = [
        "dataset=cifar10_jpeg",
        "dataset.subset=10000",
        "balance=mean",
        "optimizer.lr=0.01",
        "epochs=2",
        "progress=none",
    ]
    # one intra-op thread: small per-sample-gradient batches gain nothing from more, and
    # on a shared CPU the extra threads only contend (about 2x faster here)
    result = run_in_process(args, tmp_path, cli_env(OMP_NUM_THREADS="1"), merge_stderr=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    summary = finished_run(tmp_path, epochs=2)
    acc = summary["final"]["test/acc"]
    assert acc > MIN_TEST_ACC, f"test accuracy {acc:.3f} after 2 epochs (need > {MIN_TEST_ACC})"
