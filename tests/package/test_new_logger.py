"""Adding a logger is one Python module plus one YAML file: a toy one, run beside W&B.

A toy logger, ``jsonl`` (one JSON line per event into a file of the run directory), lives in a
temporary module beside its ``logger/jsonl.yaml`` in a temporary config folder, given to the
command with ``--config-dir``. A job killed mid-run and resumed continues the toy logger's run
with the id it returned; a class that is not a logger is refused in one line before the run
directory holds anything. No file of the repository changes.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from support.grab_run import Job, cli_env, run_grab

MODULE = '''
"""A toy logger: every event as one JSON line in <run_dir>/<file>."""

import json
from pathlib import Path

from grab_exp.logging import RunLogger


class JsonLinesLogger(RunLogger):
    def __init__(self, file: str = "events.jsonl") -> None:
        self.file = file
        self.path = None

    def _write(self, **event) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps(event) + "\\n")

    def start(self, run_dir, config, resume_id=None, rows=()):
        self.path = Path(run_dir) / self.file
        run_id = resume_id or "toy-1"
        self._write(event="start", id=run_id, resumed=resume_id is not None, seed=config["seed"])
        return run_id

    def log(self, row, epoch):
        self._write(event="log", epoch=epoch, loss=row["train/loss"])

    def finish(self, status="finished", summary=None):
        self._write(event="finish", status=status, wall_time_s=(summary or {}).get("wall_time_s"))
'''
YAML = """\
# The toy logger beside W&B's keys (W&B stays off): one JSON line per event.
defaults:
  - local  # logger/local: logger.wandb.* with W&B off
extra:
  jsonl:
    _target_: jsonl_logger.JsonLinesLogger  # the class (jsonl_logger.py on PYTHONPATH)
    file: events.jsonl  # file in the run directory
"""
SMOKE = ["experiment=smoke", "progress=none", "device=cpu", "logger=jsonl"]


@pytest.fixture
def user(tmp_path):
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "jsonl_logger.py").write_text(MODULE)
    (tmp_path / "my_conf" / "logger").mkdir(parents=True)
    (tmp_path / "my_conf" / "logger" / "jsonl.yaml").write_text(YAML)
    path = os.pathsep.join([str(tmp_path / "code"), os.environ.get("PYTHONPATH", "")])
    return {"cwd": tmp_path, "env": cli_env(PYTHONPATH=path, OMP_NUM_THREADS="1")}


def _events(run_dir) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_toy_logger_gets_every_epoch_and_the_end(user):
    run_dir = user["cwd"] / "run"
    args = ["--config-dir", "my_conf", *SMOKE, "epochs=3", f"hydra.run.dir={run_dir}"]
    done = run_grab(args, user["cwd"], user["env"])
    assert done.returncode == 0, done.stdout
    events = _events(run_dir)
    assert [e["event"] for e in events] == ["start", "log", "log", "log", "finish"]
    assert [e["epoch"] for e in events if e["event"] == "log"] == [1, 2, 3]
    assert events[0] == {"event": "start", "id": "toy-1", "resumed": False, "seed": 0}
    assert events[-1]["status"] == "finished" and events[-1]["wall_time_s"] > 0
    rows = (run_dir / "metrics.csv").read_text().splitlines()[1:]
    losses = [float(row.split(",")[1]) for row in rows]  # train/loss, metrics.csv's column 2
    assert [e["loss"] for e in events if e["event"] == "log"] == pytest.approx(losses)


@pytest.mark.slow
def test_a_resumed_job_continues_the_toy_loggers_run(user):
    run_dir = user["cwd"] / "run"
    args = ["--config-dir", "my_conf", *SMOKE, "epochs=10", f"hydra.run.dir={run_dir}"]
    job = Job(args, user["cwd"], user["env"])
    deadline = time.monotonic() + 240
    while not (run_dir / "checkpoint.pt").exists():  # killed after its first epoch
        assert job.process.poll() is None and time.monotonic() < deadline, job.finish()
        time.sleep(0.1)
    job.process.kill()
    job.process.wait()
    again = run_grab(args, user["cwd"], user["env"])
    assert again.returncode == 0, again.stdout
    starts = [e for e in _events(run_dir) if e["event"] == "start"]
    assert starts[0]["resumed"] is False and starts[-1] == {**starts[0], "resumed": True}


def test_a_class_that_is_not_a_logger_is_refused_before_anything_is_written(user):
    (user["cwd"] / "code" / "not_a_logger.py").write_text("class Plain:\n    pass\n")
    run_dir = user["cwd"] / "run"
    args = ["experiment=smoke", "+logger.extra.bad._target_=not_a_logger.Plain"]
    done = run_grab([*args, f"hydra.run.dir={run_dir}"], user["cwd"], user["env"])
    assert done.returncode == 1, done.stdout
    line = done.stdout.strip().splitlines()[-1]
    assert line == (
        "error: logger.extra.bad._target_: got 'not_a_logger.Plain'; allowed: a subclass of "
        "grab_exp.logging.RunLogger"
    ), done.stdout
    assert not run_dir.exists()
