"""Sweeps that stop when told, failures that say why, runs that never mix two configs.

Real processes throughout: real signals to a real joblib (or basic) sweep and to its process
group, a real edited preset in a config folder of the test's own, a real full file system (a
tmpfs, where this machine lets the test mount one), real umasks. Tiny synthetic runs (logistic
regression on 64-256 generated examples), so each test takes seconds.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import signal
import socket
import subprocess
import time

import pytest
import torch
from support.grab_run import GRAB, Job, cli_env, run_cli
from support.run_files import read_rows, wait_for

from grab_exp.runner.rundir.checkpoint import CHECKPOINT_NAME
from grab_exp.runner.rundir.lock import LOCK_NAME, RunLock

TINY = ["experiment=smoke", "model=logreg", "dataset.num_test=32", "progress=none", "device=cpu"]
LONG = [*TINY, "dataset.num_train=256", "epochs=400"]  # a job that trains until it is stopped
JOBLIB = ["hydra/launcher=joblib_local", "hydra.launcher.n_jobs=2"]
SIGNAL_TIMEOUT_S = 120
pytestmark = pytest.mark.slow


def _summaries(cwd) -> dict[str, dict]:
    return {
        p.parent.name: json.loads(p.read_text()) for p in (cwd / "outputs").rglob("summary.json")
    }


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is gone, only not yet reaped
        return handle.read().rsplit(")", 1)[1].split()[0] != "Z"


def _running_jobs(root, count: int):
    """Wait until ``count`` jobs under ``root`` wrote their first row; their run directories."""

    def started():
        dirs = [p.parent for p in root.rglob("metrics.csv") if read_rows(p.parent)[1]]
        return len(dirs) >= count and dirs

    return wait_for(started, SIGNAL_TIMEOUT_S, f"{count} running jobs")


STOPS = {
    # launcher, who gets the signal, the signal, jobs, jobs running at once
    "joblib-parent-sigterm": (JOBLIB, "parent", signal.SIGTERM, "seed=1,2,3", 2),
    "joblib-group-sigint": (JOBLIB, "group", signal.SIGINT, "seed=1,2,3", 2),
    "basic-group-sigterm": ([], "group", signal.SIGTERM, "seed=1,2", 1),
}


@pytest.mark.parametrize("case", STOPS)
def test_a_stopped_sweep_interrupts_its_jobs_starts_none_and_leaves_no_process(tmp_path, case):
    """The running jobs end ``interrupted``, no queued job starts (no directory), every
    process is gone, and the parent exits 128 + signal with one line."""
    launcher, target, signum, seeds, running = STOPS[case]
    log_path = tmp_path / "sweep.log"
    with open(log_path, "w") as log:
        sweep = subprocess.Popen(
            [*GRAB, "-m", *LONG, seeds, *launcher],
            cwd=tmp_path,
            env=cli_env(OMP_NUM_THREADS="1"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's job
        )
    try:
        dirs = _running_jobs(tmp_path / "outputs", running)
        if target == "group":
            os.killpg(sweep.pid, signum)
        else:
            os.kill(sweep.pid, signum)
        sweep.wait(timeout=SIGNAL_TIMEOUT_S)
    finally:
        if sweep.poll() is None:
            os.killpg(sweep.pid, signal.SIGKILL)
            sweep.wait()
    output = log_path.read_text()
    assert sweep.returncode == 128 + signum, output
    summaries = _summaries(tmp_path)
    assert sorted(summaries) == sorted(d.name for d in dirs), output  # no queued job started
    assert {s["status"] for s in summaries.values()} == {"interrupted"}, output
    last = output.strip().splitlines()[-1]
    name = signal.Signals(signum).name
    never = "none" if running == 1 and seeds.count(",") == 0 else "job "
    assert re.fullmatch(
        rf"interrupted \({name}\): {running} jobs interrupted \(.*\), \d never started "
        rf"\(({never}.*|none)\); the same command resumes the sweep",
        last,
    ), output
    assert "Traceback" not in output
    pids = [s["pid"] for s in summaries.values()]
    wait_for(lambda: not any(_alive(pid) for pid in pids), 10, "every job's process to end")


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_failed_jobs_do_not_stop_their_siblings_and_each_gets_its_line(tmp_path, launcher):
    """Two of three jobs diverge (NaN): the third finishes, each failed job gets one line
    (overrides, directory, error) at the end, and its summary and log the same error."""
    args = ["-m", *TINY, "dataset.num_train=64", "epochs=2", "optimizer.lr=1e30,0.01,1e35"]
    result = run_cli([*args, *(JOBLIB if launcher == "joblib" else [])], tmp_path, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 2, result.stderr
    for line, lr in zip(lines, ("1e+30", "1e+35"), strict=True):
        assert re.fullmatch(
            rf"error: job \d \(.*optimizer.lr={re.escape(lr)}\) in \S+: epoch 1: the training "
            r"loss is .* \(not finite\); the run stopped and no epoch finished, so there is no "
            r"checkpoint \(try a smaller optimizer.lr\)",
            line,
        ), line
    summaries = _summaries(tmp_path)
    assert sorted(s["status"] for s in summaries.values()) == ["failed", "failed", "finished"]
    for run_dir in (tmp_path / "outputs").rglob("summary.json"):
        summary = json.loads(run_dir.read_text())
        if summary["status"] == "failed":
            assert summary["error"]["type"] == "NonFiniteLossError"
            assert summary["error"]["message"] in result.stderr
            assert summary["error"]["message"] in (run_dir.parent / "__main__.log").read_text()
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("launcher", ["basic", "joblib"])
def test_a_sweep_with_a_job_that_cannot_run_trains_none(tmp_path, launcher):
    """``-m experiment=smoke seed=13 batch_size=16,0``: job 1's bad value is found before any
    job starts, so none does (job 0 used to train first): one line per bad job, exit 1, nothing
    written."""
    args = ["-m", "experiment=smoke", "seed=13", "batch_size=16,0", "progress=none"]
    result = run_cli([*args, *(JOBLIB if launcher == "joblib" else [])], tmp_path, timeout=300)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "error: 1 of 2 jobs of this sweep cannot run; none started", lines
    assert re.fullmatch(r"  job 1 \(.*batch_size=0.*\): batch_size: got 0; allowed: .*", lines[1])
    assert len(lines) == 2 and "Traceback" not in result.stderr
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_hydras_batches_of_jobs_are_refused_in_one_line(tmp_path):
    """``hydra.sweeper.max_batch_size``: the sweep checks every job, then launches them all, so
    Hydra's batches would be a setting that does nothing; it is refused before anything runs."""
    result = run_cli(["-m", *TINY, "seed=0,1", "hydra.sweeper.max_batch_size=1"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == (
        "error: hydra.sweeper.max_batch_size: got 1; allowed: null (the sweep checks every job, "
        "then launches them all)"
    )
    assert not (tmp_path / "outputs").exists() and not (tmp_path / "multirun").exists()


def test_fail_fast_starts_no_job_of_a_sweep_with_a_bad_one(tmp_path):
    args = ["-m", *TINY, "batch_size=16,0", "hydra.sweeper.fail_fast=true"]
    result = run_cli(args, tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith("error: 1 of 2 jobs of this sweep cannot run; none started")
    assert not (tmp_path / "outputs").exists()


# ---------------------------------------------------------------- one run directory, one config


PRESET = """# @package _global_
defaults:
  - override /dataset: synthetic
  - override /balance: mean
name: drift
epochs: 300
optimizer:
  lr: {lr}
"""


def test_a_resume_after_the_preset_was_edited_is_refused_in_one_line(tmp_path):
    """Edit ``optimizer.lr`` in an ``experiment=`` file after epoch 1, run the same command:
    one line naming the key, both values and the two ways forward; nothing is touched."""
    conf = tmp_path / "extra" / "experiment"
    conf.mkdir(parents=True)
    (conf / "drift_probe.yaml").write_text(PRESET.format(lr=0.001))
    args = ["--config-dir", str(tmp_path / "extra"), "experiment=drift_probe", *TINY[1:]]
    args += ["dataset.num_train=256"]
    env = cli_env(OMP_NUM_THREADS="1")
    first = Job(args, tmp_path, env)
    (run_dir,) = _running_jobs(tmp_path / "outputs", 1)
    os.kill(first.pid, signal.SIGTERM)
    assert first.finish()[0] == 143
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    (conf / "drift_probe.yaml").write_text(PRESET.format(lr=0.05))
    result = run_cli(args, tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.fullmatch(
        r"error: \S+ holds a run of another config \(summary.json: optimizer.lr 0.001 -> 0.05\)"
        r"; overwrite=true starts it over \(the old run is kept aside\), or name=<new name> "
        r"runs this config in a directory of its own\n",
        result.stderr,
    ), result.stderr
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


# ---------------------------------------------------------------- values checked up front


HOSTILE = {
    "seed=4294967296": "seed: got 4294967296; allowed: an integer in 0..4294967295",
    f"seed={2**70}": f"seed: got {2**70}; allowed: an integer in 0..4294967295",
    "dataset.num_train=0": "dataset.num_train: got 0; allowed: an integer >= 1",
    "dataset.subset=100000": "dataset.subset: got 100000; allowed: null or an integer in 1..2048",
    "model=mlp model.hidden=[100000000]": "model: got 'mlp'; allowed: a model that fits",
}


@pytest.mark.parametrize("override", HOSTILE)
def test_a_hostile_value_is_one_line_before_anything_is_written(tmp_path, override):
    result = run_cli(["experiment=smoke", *override.split()], tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.startswith(f"error: {HOSTILE[override]}"), result.stderr
    assert len(result.stderr.splitlines()) == 1, result.stderr
    assert not (tmp_path / "outputs").exists()


# ---------------------------------------------------------------- a full disk


@pytest.fixture
def small_tmpfs(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_a_full_disk_is_one_line_naming_the_file_and_the_resume_is_exact(small_tmpfs):
    """The disk fills during epoch 2: one line naming the file and the errno's text, the
    epoch-1 checkpoint intact; after space is freed, the same command finishes every epoch."""
    args = [*TINY, "dataset.num_train=256", "epochs=3", "hydra.run.dir=disk/run"]
    env = cli_env(OMP_NUM_THREADS="1")
    cwd = small_tmpfs.parent
    job = Job(args, cwd, env)
    (run_dir,) = _running_jobs(small_tmpfs, 1)
    os.kill(job.pid, signal.SIGSTOP)
    filler = small_tmpfs / "filler"
    subprocess.run(["dd", "if=/dev/zero", f"of={filler}", "bs=4k"], capture_output=True)
    os.kill(job.pid, signal.SIGCONT)
    status, output = job.finish()
    assert status == 1, output
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in output, output
    assert re.fullmatch(
        r"error: could not write \S+/disk/run/\S+: No space left on device", errors[0]
    ), output
    state = torch.load(run_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    assert state["epoch"] == 0
    filler.unlink()
    again = Job(args, cwd, env, log="again.log")
    assert again.finish()[0] == 0
    assert [row["epoch"] for row in read_rows(run_dir)[1]] == [1, 2, 3]


# ---------------------------------------------------------------- file modes, small things


def test_run_files_follow_the_umask(tmp_path):
    args = [*TINY, "dataset.num_train=64", "epochs=1", "hydra.run.dir=run"]
    done = subprocess.run(
        [*GRAB, *args], cwd=tmp_path, env=cli_env(), preexec_fn=lambda: os.umask(0o027)
    )
    assert done.returncode == 0
    for name in ("metrics.csv", "summary.json", CHECKPOINT_NAME, LOCK_NAME, ".hydra/config.yaml"):
        assert oct((tmp_path / "run" / name).stat().st_mode & 0o777) == oct(0o640), name


def test_a_stale_lock_of_a_reused_pid_says_so(tmp_path, caplog):
    """The lock file names a live process that does not hold the lock (its pid was reused)."""
    record = {"pid": os.getppid(), "host": socket.gethostname(), "since": "2026-01-01T00:00:00"}
    (tmp_path / LOCK_NAME).write_text(json.dumps(record))
    with caplog.at_level(logging.WARNING, logger="grab_exp"):
        lock = RunLock(tmp_path)
        lock.acquire()
        lock.release()
    assert "that job ended; its pid now belongs to another process" in caplog.text
    assert "that process is gone" not in caplog.text


def test_more_sigterms_after_the_first_still_exit_143(tmp_path):
    """SIGTERM, then one every 5 ms until the process ends: always status 143."""
    job = Job([*LONG, "dataset.num_train=64"], tmp_path, cli_env(OMP_NUM_THREADS="1"))
    _running_jobs(tmp_path / "outputs", 1)
    while job.process.poll() is None:
        try:
            os.kill(job.pid, signal.SIGTERM)
        except ProcessLookupError:
            break
        time.sleep(0.005)
    status, output = job.finish()
    assert status == 143, output


def test_a_killed_sweep_leaves_no_worker_training(tmp_path):
    """SIGKILL to a joblib sweep's process (what a time limit sends after its SIGINT): its
    workers, out of its process group, notice within a second, stop their jobs at a step
    boundary, ``interrupted``, and exit, instead of training on."""
    log_path = tmp_path / "sweep.log"
    with open(log_path, "w") as log:
        sweep = subprocess.Popen(
            [*GRAB, "-m", *LONG, "seed=1,2", *JOBLIB],
            cwd=tmp_path,
            env=cli_env(OMP_NUM_THREADS="1"),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    pids: list[int] = []
    try:
        _running_jobs(tmp_path / "outputs", 2)
        pids = [s["pid"] for s in _summaries(tmp_path).values()]
        assert len(pids) == 2 and sweep.pid not in pids  # the jobs run in the workers
        os.kill(sweep.pid, signal.SIGKILL)
        sweep.wait(timeout=SIGNAL_TIMEOUT_S)
        wait_for(lambda: not any(map(_alive, pids)), SIGNAL_TIMEOUT_S, "the workers to end")
    finally:
        for pid in [*pids, sweep.pid]:  # whatever is left, if the test failed
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert {s["status"] for s in _summaries(tmp_path).values()} == {"interrupted"}
