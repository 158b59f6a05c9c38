"""Locked run directories and stop signals, with real processes, real signals and real files.

* Two real processes on one run directory: while the first holds it (paused by SIGSTOP inside
  epoch 2, so the race is decided, not timed), the same command and ``overwrite=true`` both
  exit 1 at once with one line naming the holder's pid and host, and touch none of its files.
* SIGTERM and SIGINT mid-epoch: status ``interrupted``, exit 143 / 130 and the one line; the
  same command then resumes, and its metrics and final state equal an uninterrupted run's.
* A lock left by a SIGKILLed holder is taken over with a warning; ``metrics.csv`` refuses an
  epoch that does not follow its last one.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys

import pytest
import torch
from support.grab_run import SMOKE, Job, cli_env
from support.run_files import computed, read_rows, run_dirs, temp_files, wait_for

from grab_exp.logging.local import LocalStore
from grab_exp.runner.rundir.checkpoint import CHECKPOINT_NAME
from grab_exp.runner.rundir.lock import LOCK_NAME, RunDirInUseError, RunLock

EPOCHS = 3
# 512 examples in batches of 16: 32 steps per epoch, about a second each on a small CPU
ARGS = [*SMOKE, f"epochs={EPOCHS}", "dataset.num_train=512", "dataset.num_test=64"]
STOPS = {"sigterm": (signal.SIGTERM, 143), "sigint": (signal.SIGINT, 130)}


def _first_row(cwd):
    files = list((cwd / "outputs").rglob("metrics.csv"))
    return files and len(files[0].read_text().splitlines()) >= 2 and files[0].parent


def _state(run_dir):
    return torch.load(run_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=True)


def _snapshot(run_dir):
    """Every file of the run directory (Hydra's included) and its bytes."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}


def _pause_at_first_rows(victims: dict) -> dict:
    """SIGSTOP each ``name: (job, cwd)`` as soon as its first epoch's row is written (inside
    epoch 2, or later on a slow machine); return each run directory."""
    paused = {}

    def all_paused():
        for name, (job, cwd) in victims.items():
            if name not in paused and (run_dir := _first_row(cwd)):
                os.kill(job.pid, signal.SIGSTOP)
                paused[name] = run_dir
            elif name not in paused and job.process.poll() is not None:
                raise AssertionError(f"{name} ended ({job.process.returncode}) before its row")
        return len(paused) == len(victims)

    wait_for(all_paused, 300, "the first epoch's rows")
    return paused


def _intruders(run_dir, cwd) -> dict:
    """Run the same command and ``overwrite=true`` against the (paused) holder's directory;
    what they printed, and whether the holder's files stayed untouched."""
    before = _snapshot(run_dir)
    env = cli_env(OMP_NUM_THREADS="1")
    again = Job(ARGS, cwd, env, log="again.log")
    overwrite = Job([*ARGS, "overwrite=true"], cwd, env, log="overwrite.log")
    result = {"again": again.finish(), "overwrite": overwrite.finish(), "run_dir": run_dir}
    result["untouched"] = _snapshot(run_dir) == before
    result["aside"] = sorted(p.name for p in run_dir.parent.iterdir() if ".old" in p.name)
    return result


def _stop(victim: Job, run_dir, signum: int) -> dict:
    """Deliver ``signum`` to the paused ``victim`` and let it go on; what it left behind."""
    os.kill(victim.pid, signum)
    os.kill(victim.pid, signal.SIGCONT)  # the pending signal is handled as it resumes
    status, log = victim.finish()
    return {
        "status": status,
        "log": log,
        "run_dir": run_dir,
        "rows": read_rows(run_dir)[1],
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "lock": (run_dir / LOCK_NAME).read_text(),
    }


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """An uninterrupted run; two runs stopped by SIGTERM / SIGINT (the SIGTERM one first
    intruded on), then resumed by the same command."""
    cwd = {name: tmp_path_factory.mktemp(name) for name in ("reference", *STOPS)}
    env = cli_env(OMP_NUM_THREADS="1")
    jobs = {name: Job(ARGS, folder, env) for name, folder in cwd.items()}
    try:
        paused = _pause_at_first_rows({name: (jobs[name], cwd[name]) for name in STOPS})
        results = {"intruders": _intruders(paused["sigterm"], cwd["sigterm"])}
        for name, (signum, _) in STOPS.items():
            results[name] = _stop(jobs[name], paused[name], signum)
            jobs[f"{name}_resumed"] = Job(ARGS, cwd[name], env, log="resumed.log")
        for name in ("reference", "sigterm_resumed", "sigint_resumed"):
            status, log = jobs[name].finish()
            results[name] = {"status": status, "log": log}
            results[name]["run_dir"] = run_dirs(jobs[name].log_path.parent)[0]
        return results
    finally:
        for job in jobs.values():
            if job.process.poll() is None:
                job.process.kill()
                job.process.wait()


def test_a_second_job_on_a_locked_directory_exits_at_once_with_one_line(runs):
    intruders = runs["intruders"]
    run_dir = intruders["run_dir"]
    holder = rf"is in use by pid \d+ on {re.escape(socket.gethostname())} since \S+"
    for name in ("again", "overwrite"):
        status, log = intruders[name]
        assert status == 1, log
        lines = [line for line in log.splitlines() if line.strip()]
        assert len(lines) == 1 and "Traceback" not in log, log
        assert re.fullmatch(rf"error: {re.escape(str(run_dir))} {holder}", lines[0]), lines[0]
    # not appended to, not moved aside, not resumed from; not even Hydra's files rewritten
    assert intruders["untouched"]
    assert intruders["aside"] == []


@pytest.mark.parametrize("name", STOPS)
def test_a_stop_signal_marks_the_run_interrupted_with_one_line(runs, name):
    stopped, (_, code) = runs[name], STOPS[name]
    run_dir = stopped["run_dir"]
    assert stopped["status"] == code, stopped["log"]
    assert stopped["log"].strip().splitlines()[-1] == (
        f"interrupted: {run_dir}; the same command resumes it"
    )
    assert "Traceback" not in stopped["log"]
    assert 1 <= len(stopped["rows"]) < EPOCHS  # stopped inside the run, with whole epochs only
    summary = stopped["summary"]
    assert summary["status"] == "interrupted"
    assert summary["host"] == socket.gethostname() and isinstance(summary["pid"], int)
    assert stopped["lock"] == ""  # released cleanly: the next job takes no stale lock
    assert temp_files(run_dir) == []


@pytest.mark.parametrize("name", STOPS)
def test_the_same_command_resumes_to_the_uninterrupted_result(runs, name):
    resumed, reference = runs[f"{name}_resumed"], runs["reference"]
    assert resumed["status"] == 0 and reference["status"] == 0, resumed["log"]
    assert "resuming" in resumed["log"] and "stale lock" not in resumed["log"]
    header, rows = read_rows(resumed["run_dir"])
    ref_header, ref_rows = read_rows(reference["run_dir"])
    assert header == ref_header and [row["epoch"] for row in rows] == [1, 2, 3]
    assert computed(rows) == computed(ref_rows)
    state, ref_state = _state(resumed["run_dir"]), _state(reference["run_dir"])
    assert state["model"].keys() == ref_state["model"].keys()
    for part, tensor in ref_state["model"].items():
        assert torch.equal(state["model"][part], tensor), part  # bit for bit
    assert json.loads((resumed["run_dir"] / "summary.json").read_text())["status"] == "finished"


HOLD = (
    "import sys, time\n"
    "from grab_exp.runner.rundir.lock import RunLock\n"
    "RunLock(sys.argv[1]).acquire()\n"
    "print('locked', flush=True)\n"
    "time.sleep(120)\n"
)


def test_a_dead_holders_lock_is_taken_over_with_a_warning(tmp_path, caplog):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunDirInUseError, match=rf"in use by pid {holder.pid} on "):
            RunLock(tmp_path).acquire()
    finally:
        holder.kill()  # SIGKILL: the holder cannot clean up
        holder.wait()
    lock = RunLock(tmp_path)
    with caplog.at_level(logging.WARNING, logger="grab_exp"):
        assert lock.acquire()["pid"] == os.getpid()
    assert f"taking over the stale lock of pid {holder.pid}" in caplog.text
    lock.release()
    assert (tmp_path / LOCK_NAME).read_text() == ""
    caplog.clear()
    RunLock(tmp_path).acquire()  # a clean release leaves no stale lock behind
    assert "stale" not in caplog.text


def test_metrics_csv_refuses_an_epoch_that_does_not_follow_the_last(tmp_path):
    store = LocalStore(tmp_path, ("epoch", "loss"))
    store.append({"epoch": 1, "loss": 1.0})
    for epoch in (1, 3):
        with pytest.raises(ValueError, match=rf"refusing to append epoch {epoch} after epoch 1"):
            store.append({"epoch": epoch, "loss": 2.0})
    LocalStore(tmp_path, ("epoch", "loss")).append({"epoch": 2, "loss": 2.0})  # a fresh store
    assert [row["epoch"] for row in store.read_metrics()] == [1, 2]


def test_a_submitit_preemption_requeues_the_job_and_it_resumes(runs, tmp_path):
    """Hydra's submitit launcher (its local executor): submitit's preemption signal to the task
    stops it at a step boundary; submitit requeues it and the requeued task resumes the run."""
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    sweep = Job(
        ["-m", "hydra/launcher=submitit_local", *ARGS], tmp_path, cli_env(OMP_NUM_THREADS="1")
    )
    try:
        run_dir = wait_for(lambda: _first_row(tmp_path), 300, "the first epoch's row", sweep)
        task = json.loads((run_dir / "summary.json").read_text())["pid"]  # not the sweep's pid
        os.kill(task, signal.SIGUSR2)
        status, log = sweep.finish()
    finally:
        if sweep.process.poll() is None:
            sweep.process.kill()
    assert status == 0, log
    (task_log,) = (tmp_path / "outputs").rglob(".submitit/*/*_0_log.out")
    text = task_log.read_text()
    assert "Caught signal SIGUSR2" in text and "Requeued job" in text, text
    assert re.search(r"resuming after epoch [12]\b", text), text
    assert computed(read_rows(run_dir)[1]) == computed(read_rows(runs["reference"]["run_dir"])[1])
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_a_stop_before_the_first_epoch_ends_says_the_rerun_starts_over(tmp_path):
    """SIGTERM inside epoch 1 (no checkpoint yet): the line says the rerun starts over."""
    args = [*SMOKE, "epochs=1", "dataset.num_train=2048", "dataset.num_test=64"]
    job = Job(args, tmp_path, cli_env(OMP_NUM_THREADS="1"))
    try:
        wait_for(lambda: "step 10/128" in job.log_path.read_text(), 120, "a step line", job)
        os.kill(job.pid, signal.SIGTERM)
        status, log = job.finish()
    finally:
        if job.process.poll() is None:
            job.process.kill()
    (run_dir,) = run_dirs(tmp_path)
    assert status == 143, log
    assert not (run_dir / CHECKPOINT_NAME).exists()
    assert log.strip().splitlines()[-1] == (
        f"interrupted: {run_dir}; no epoch had finished: the same command starts it over"
    )
