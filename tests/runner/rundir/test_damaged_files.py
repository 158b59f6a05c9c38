"""Damaged run files: every read succeeds or stops with one line naming the file and the fix.

One real run finishes; copies of its directory are damaged (truncated or random bytes in
``summary.json``, ``checkpoint.pt``, ``metrics.csv``) and the same command runs on each, all
concurrently. ``overwrite=true`` always starts over, whatever is inside; the report leaves out
a finished run whose ``metrics.csv`` was cut, and an interrupted one, by name.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from support.grab_run import cli_env, run_cli, run_in_process
from support.run_files import read_rows

from grab_exp.report.collect import read_runs
from grab_exp.report.frames import ReportWarning

ARGS = ["experiment=smoke", "dataset.num_train=256", "dataset.num_test=64", "progress=none"]
REMEDY = "overwrite=true starts the run over"


def _cut(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _garbage(path: Path) -> None:
    path.write_bytes(os.urandom(4096))


def _unfinished(run_dir: Path) -> None:
    """Mark the run as still running, so the next job resumes from its checkpoint."""
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps({**summary, "status": "running"}))


# case -> (damage, extra overrides)
CASES = {
    "summary_cut": (lambda d: _cut(d / "summary.json"), []),
    "summary_garbage": (lambda d: _garbage(d / "summary.json"), []),
    "checkpoint_cut": (lambda d: (_unfinished(d), _cut(d / "checkpoint.pt")), []),
    "checkpoint_garbage": (lambda d: (_unfinished(d), _garbage(d / "checkpoint.pt")), []),
    "metrics_garbage": (lambda d: (_unfinished(d), _garbage(d / "metrics.csv")), []),
    "all_garbage_overwrite": (
        lambda d: [_garbage(d / name) for name in ("summary.json", "checkpoint.pt", "metrics.csv")],
        ["overwrite=true"],
    ),
}


def _run(run_dir: Path, extra: list[str]):
    args = [*ARGS, *extra, f"hydra.run.dir={run_dir}"]
    return run_cli(args, run_dir.parent, timeout=180, OMP_NUM_THREADS="1")


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    """A finished run, and the result of the same command on each damaged copy of it."""
    root = tmp_path_factory.mktemp("damaged")
    base = root / "base" / "run"
    base.parent.mkdir()
    args = [*ARGS, f"hydra.run.dir={base}"]  # the finished run: its files are all it gives
    finished = run_in_process(args, root / "base", cli_env(OMP_NUM_THREADS="1"), merge_stderr=False)
    assert finished.returncode == 0, finished.stderr
    copies = {}
    for case, (damage, _) in CASES.items():
        copies[case] = root / case / "run"
        shutil.copytree(base, copies[case])
        damage(copies[case])
    with ThreadPoolExecutor(2) as pool:
        futures = {case: pool.submit(_run, copies[case], CASES[case][1]) for case in CASES}
        return {"base": base, **{case: (f.result(), copies[case]) for case, f in futures.items()}}


@pytest.mark.parametrize(
    ("case", "name"),
    [
        ("summary_cut", "summary.json"),
        ("summary_garbage", "summary.json"),
        ("checkpoint_cut", "checkpoint.pt"),
        ("checkpoint_garbage", "checkpoint.pt"),
    ],
)
def test_a_damaged_file_stops_the_job_with_one_line_naming_it(damaged, case, name):
    result, run_dir = damaged[case]
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stderr
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert lines[0].startswith(f"error: {run_dir / name} is damaged ("), lines[0]
    assert lines[0].endswith(f"{REMEDY} (the damaged files are kept aside)"), lines[0]
    assert "weights_only=False" not in lines[0]  # torch's unsafe advice is not passed on


def test_a_damaged_metrics_csv_is_rebuilt_from_the_checkpoint(damaged):
    result, run_dir = damaged["metrics_garbage"]
    assert result.returncode == 0, result.stderr
    assert read_rows(run_dir)[1] == read_rows(damaged["base"])[1]


def test_overwrite_starts_over_whatever_is_inside(damaged):
    result, run_dir = damaged["all_garbage_overwrite"]
    assert result.returncode == 0, result.stderr
    aside = run_dir.with_name("run.old1")
    for name in ("summary.json", "checkpoint.pt", "metrics.csv"):
        assert (aside / name).stat().st_size == 4096  # the damaged files, kept
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    assert [row["epoch"] for row in read_rows(run_dir)[1]] == [1, 2]


def test_the_report_names_cut_and_interrupted_runs(damaged, tmp_path):
    good = tmp_path / "sweep" / "good"
    shutil.copytree(damaged["base"], good)
    cut, stopped = good.with_name("cut"), good.with_name("stopped")
    shutil.copytree(good, cut)
    shutil.copytree(good, stopped)
    text = (cut / "metrics.csv").read_text()
    (cut / "metrics.csv").write_text(text[: text.rindex(",")])  # the last row, cut mid-row
    summary = json.loads((stopped / "summary.json").read_text())
    (stopped / "summary.json").write_text(json.dumps({**summary, "status": "interrupted"}))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", ReportWarning)
        runs = read_runs([tmp_path / "sweep"])
    messages = "\n".join(str(w.message) for w in caught)
    assert [identity["seed"] for _, identity in runs] == [0]  # only the good run
    assert f"skipping {cut.resolve()}: incomplete metrics.csv" in messages, messages
    assert f"skipping unfinished run {stopped.resolve()} (status 'interrupted')" in messages
