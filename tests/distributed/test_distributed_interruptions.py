"""The reliability probes on a 2-process gloo data-parallel job (real ranks, signals, files).

One job trains; once it wrote a row both ranks are paused (SIGSTOP). A second 2-rank job on the
same run directory then exits 1 on both ranks with the lock holder's line (rank 0 holds the
lock, rank 1 learns it from rank 0). SIGTERM to both ranks stops the first job as
``interrupted`` (exit 143, the one line). A cut checkpoint stops the resume on both ranks with
one line naming it; with the checkpoint restored, the same command resumes to the end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from test_distributed import launch, stderr_of, stop, trained_an_epoch, wait_for

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="gloo ranks on Linux")
EPOCHS = 20  # the first job must still be training when the probes stop it (0.2 s polls)


def _args(run_dir: Path) -> list[str]:
    return [
        "-m",
        "grab_exp",
        *("experiment=smoke", "model=logreg", "balance=cd_grab", "distributed=true"),
        *("dataset.num_train=256", "dataset.num_test=32", f"epochs={EPOCHS}", "batch_size=8"),
        *("device=cpu", "progress=none", "distributed.timeout_s=30"),
        f"hydra.run.dir={run_dir}",
    ]


def _finish(procs, timeout: float = 240) -> list[int]:
    try:
        return [proc.wait(timeout=timeout) for proc in procs]
    finally:
        stop(procs)


@pytest.fixture(scope="module")
def probes(tmp_path_factory):
    root = tmp_path_factory.mktemp("dp_probes")
    run_dir = root / "run"
    folders = {name: root / name for name in ("first", "second", "damaged", "resumed")}
    for folder in folders.values():
        folder.mkdir()
    first = launch(_args(run_dir), folders["first"])
    try:
        wait_for(trained_an_epoch(run_dir), first, folders["first"], timeout=240)
        for proc in first:
            os.kill(proc.pid, signal.SIGSTOP)
        second = _finish(launch(_args(run_dir), folders["second"]))
        for proc in first:
            os.kill(proc.pid, signal.SIGTERM)
            os.kill(proc.pid, signal.SIGCONT)
        stopped = _finish(first)
    finally:
        stop(first)
    summary = json.loads((run_dir / "summary.json").read_text())
    good = (run_dir / "checkpoint.pt").read_bytes()
    (run_dir / "checkpoint.pt").write_bytes(good[: len(good) // 2])
    damaged = _finish(launch(_args(run_dir), folders["damaged"]))
    (run_dir / "checkpoint.pt").write_bytes(good)
    resumed = _finish(launch(_args(run_dir), folders["resumed"]))
    return {
        "run_dir": run_dir,
        "folders": folders,
        "codes": {"second": second, "stopped": stopped, "damaged": damaged, "resumed": resumed},
        "summary_at_stop": summary,
    }


def _errors(folder: Path, rank: int) -> list[str]:
    """A rank's stderr lines after any library warnings: its own last line must be the one."""
    text = stderr_of(folder, rank)
    assert "Traceback" not in text, text
    return [line for line in text.splitlines() if line.strip()][-1:]


def test_rank_0_holds_the_lock_and_both_ranks_of_a_second_job_exit(probes):
    assert probes["codes"]["second"] == [1, 1]
    for rank in (0, 1):
        lines = _errors(probes["folders"]["second"], rank)
        assert len(lines) == 1, lines
        assert lines[0].startswith(f"error: {probes['run_dir']} is in use by pid "), lines


def test_sigterm_stops_both_ranks_as_interrupted(probes):
    assert probes["codes"]["stopped"] == [143, 143], stderr_of(probes["folders"]["first"], 0)
    line = f"interrupted: {probes['run_dir']}; the same command resumes it"
    assert _errors(probes["folders"]["first"], 0)[-1] == line
    assert probes["summary_at_stop"]["status"] == "interrupted"


def test_a_cut_checkpoint_stops_both_ranks_with_one_line(probes):
    assert probes["codes"]["damaged"] == [1, 1]
    for rank in (0, 1):
        lines = _errors(probes["folders"]["damaged"], rank)
        assert len(lines) == 1 and "is damaged" in lines[0], lines
        assert lines[0].startswith(f"error: {probes['run_dir'] / 'checkpoint.pt'} is damaged")


def test_the_same_command_then_resumes_to_the_end(probes):
    folder = probes["folders"]["resumed"]
    assert probes["codes"]["resumed"] == [0, 0], stderr_of(folder, 0) + stderr_of(folder, 1)
    rows = (probes["run_dir"] / "metrics.csv").read_text().splitlines()[1:]
    assert [int(row.split(",")[0]) for row in rows] == list(range(1, EPOCHS + 1))
    summary = json.loads((probes["run_dir"] / "summary.json").read_text())
    assert summary["status"] == "finished"
