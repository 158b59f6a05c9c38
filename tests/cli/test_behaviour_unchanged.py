"""The runner computes what it computed before its redesign (commit 2eef9b3).

``tests/support/data/golden_metrics.json`` holds the per-epoch metrics of five short runs
recorded by ``scripts/record_golden_metrics.py`` at that commit; the same commands must give the
same numbers to float32 rounding. ``tests/support/data/run_before_redesign`` is a run directory
that commit left after the first epoch of the ``mean`` case: resuming it must give the golden
epoch 2.
"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from support import DATA_DIR
from support.grab_run import cli_env, run_in_process

GOLDEN = json.loads((DATA_DIR / "golden_metrics.json").read_text())
TOLERANCE = 2e-4  # float32 rounding, amplified over two epochs


def _run(overrides: list[str], run_dir: Path) -> list[dict[str, str]]:
    args = [*GOLDEN["base"], *overrides, f"hydra.run.dir={run_dir}"]
    result = run_in_process(args, run_dir.parent, cli_env(OMP_NUM_THREADS="1"))
    assert result.returncode == 0, result.stdout[-2000:]
    with open(run_dir / "metrics.csv", newline="") as handle:
        return list(csv.DictReader(handle))


def _assert_rows_equal(rows: list[dict[str, str]], golden: list[dict[str, float]]) -> None:
    assert [int(r["epoch"]) for r in rows] == [g["epoch"] for g in golden]
    for row, expected in zip(rows, golden, strict=True):
        for key, value in expected.items():
            assert float(row[key]) == pytest.approx(value, abs=TOLERANCE), (row["epoch"], key)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, list[dict[str, str]]]:
    """Every case, and the resumed run directory, one after another in this process (one
    thread each)."""
    root = tmp_path_factory.mktemp("golden")
    shutil.copytree(DATA_DIR / "run_before_redesign", root / "resumed" / "run")
    jobs = {name: case["overrides"] for name, case in GOLDEN["cases"].items()}
    jobs["resumed"] = GOLDEN["cases"]["mean"]["overrides"]
    for name in jobs:
        (root / name).mkdir(exist_ok=True)
    return {name: _run(overrides, root / name / "run") for name, overrides in jobs.items()} | {
        "root": root
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(GOLDEN["cases"]))
def test_metrics_equal_the_recorded_ones(case, runs):
    _assert_rows_equal(runs[case], GOLDEN["cases"][case]["rows"])


@pytest.mark.slow
def test_a_checkpoint_written_before_the_redesign_resumes(runs):
    # epoch 1 kept from the old checkpoint's metrics, epoch 2 trained after the resume
    _assert_rows_equal(runs["resumed"], GOLDEN["cases"]["mean"]["rows"])
    summary = json.loads((runs["root"] / "resumed" / "run" / "summary.json").read_text())
    assert summary["status"] == "finished"
