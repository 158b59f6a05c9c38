"""Nothing a ``logger.extra`` logger does reaches the run directory (issue 52, item 1).

A seeded set of misbehaving loggers (tests/support/misbehaving_loggers.py: rows and config
edited or extended, raising or exiting in ``start``, ``log`` or ``finish``) each rides along a
real short run that a well-behaved logger stops after epoch 1 (SIGTERM, as a scheduler would)
and the same command resumes. Property: ``metrics.csv`` is byte-identical to that of a run
without the bad logger (the machine's timing and memory columns left out), the run finishes
with status 0, and a logger that fails is named in one warning line (one that edits its copies
needs none). Odd ids are refused in one line before epoch 1; a hang is bounded by time and by
SIGTERM.
"""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import time
import warnings

import pytest
import torch
from support import REPO_ROOT
from support.grab_run import Job, cli_env, run_in_process
from support.misbehaving_loggers import (
    FAULTS,
    ODD_IDS,
    STOP_AFTER_FIRST_EPOCH,
    ChangesProcessState,
    MisbehavingLogger,
    overrides,
)
from support.run_files import TIMING_COLUMNS

from grab_exp.logging.build import build_loggers
from grab_exp.logging.guard import GuardedLogger
from grab_exp.runner.rundir.checkpoint import load_checkpoint
from grab_exp.runner.training.errors import user_error_line

SMALL = [
    "experiment=smoke",
    "progress=none",
    "device=cpu",
    "dataset.num_train=128",
    "dataset.num_test=32",
]
ENV = cli_env(OMP_NUM_THREADS="1")
#: every (fault, where) a logger can misbehave at and the run still finishes
CASES = [
    (fault, at)
    for fault in FAULTS
    if fault not in ("odd_id", "hang")
    for at in ("start", "log", "finish")
]
#: the cases the issue found, always run
REPORTED = [("mutate", "log"), ("add_key", "log"), ("mutate", "start"), ("raise", "log")]
SEED = 52
PICKED = 4


def seeded_cases() -> list[tuple[str, str]]:
    """:data:`REPORTED`, then :data:`PICKED` of the other :data:`CASES`, drawn with a seeded
    generator (the same every run)."""
    others = [case for case in CASES if case not in REPORTED]
    order = torch.randperm(len(others), generator=torch.Generator().manual_seed(SEED))
    return [*REPORTED, *(others[i] for i in order[:PICKED].tolist())]


def computed_text(run_dir) -> str:
    """``metrics.csv``'s text without the timing and memory columns, cell for cell as written."""
    rows = list(csv.reader(io.StringIO((run_dir / "metrics.csv").read_text(), newline="")))
    kept = [i for i, name in enumerate(rows[0]) if name not in TIMING_COLUMNS]
    return "\n".join(",".join(row[i] for i in kept) for row in rows)


def _run(cwd, run_dir, *extra: str):
    return run_in_process([*SMALL, f"hydra.run.dir={run_dir}", *extra], cwd, ENV)


@pytest.fixture(scope="module")
def clean(tmp_path_factory):
    """A run without a bad logger: the reference."""
    cwd = tmp_path_factory.mktemp("clean")
    done = _run(cwd, cwd / "run")
    assert done.returncode == 0, done.stdout
    return computed_text(cwd / "run")


@pytest.mark.parametrize(("fault", "at"), seeded_cases())
def test_a_misbehaving_logger_leaves_the_run_and_its_resume_untouched(clean, tmp_path, fault, at):
    run_dir = tmp_path / "run"
    bad = overrides("bad", fault, at)
    stopped = _run(tmp_path, run_dir, *bad, *STOP_AFTER_FIRST_EPOCH)
    assert stopped.returncode == 128 + signal.SIGTERM, stopped.stdout
    assert load_checkpoint(run_dir)["epoch"] == 0
    resumed = _run(tmp_path, run_dir, *bad)
    assert resumed.returncode == 0, resumed.stdout
    assert computed_text(run_dir) == clean
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    warnings = [line for line in resumed.stdout.splitlines() if "logger.extra.bad:" in line]
    if fault in ("raise", "exit"):  # an edit of its own copy is no failure
        assert len(warnings) == 1, resumed.stdout
        assert f"{at} failed" in warnings[0] and "skipped from now on" in warnings[0]
    else:
        assert warnings == [], resumed.stdout
    events = [json.loads(line)["event"] for line in (run_dir / "bad.events").open()]
    assert events.count("start") == 2  # called on both attempts, whatever it did before


@pytest.mark.parametrize("odd", sorted(ODD_IDS))
def test_an_id_that_is_not_a_string_is_refused_in_one_line_before_epoch_1(tmp_path, odd):
    run_dir = tmp_path / "run"
    done = _run(tmp_path, run_dir, *overrides("bad", "odd_id", "start", odd))
    assert done.returncode == 1, done.stdout
    errors = [line for line in done.stdout.splitlines() if line.startswith("error:")]
    assert errors == [
        f"error: logger.extra.bad: start returned {type(ODD_IDS[odd]).__name__} "
        f"{ODD_IDS[odd]!r} as its run id; allowed: a non-empty str (kept in checkpoint.pt to "
        "resume) or None"
    ]
    assert "Traceback" not in done.stdout
    assert not (run_dir / "metrics.csv").read_text().strip().count("\n")  # header only


def test_the_checkpoint_keeps_every_logger_id_the_run_has_had(tmp_path):
    run_dir = tmp_path / "run"
    first = _run(tmp_path, run_dir, *overrides("a", "none", "log"), *STOP_AFTER_FIRST_EPOCH)
    assert first.returncode == 128 + signal.SIGTERM, first.stdout
    assert load_checkpoint(run_dir)["logger_ids"] == {"a": "a-1", "stop": None}
    second = _run(tmp_path, run_dir, *overrides("b", "none", "log"))
    assert second.returncode == 0, second.stdout
    assert load_checkpoint(run_dir)["logger_ids"] == {"a": "a-1", "stop": None, "b": "b-1"}


def test_a_logger_named_wandb_is_refused_beside_logger_wandb(tmp_path):
    done = _run(tmp_path, tmp_path / "run", *overrides("wandb", "none", "log"))
    assert done.returncode == 1, done.stdout
    assert done.stdout.strip().splitlines()[-1] == (
        "error: logger.extra.wandb: the name wandb is logger.wandb's (logger=wandb); "
        "allowed: another name"
    )


@pytest.mark.parametrize(
    ("options", "error"),
    [
        ({"fault": "raise", "nope": 1}, "TypeError: "),  # an option the class does not take
        ({"fault": "raise", "name": 7}, "TypeError: name must be a str, got int)"),  # it raised
    ],
)
def test_a_logger_that_cannot_be_built_is_refused_in_one_line_naming_it(options, error):
    node = {"_target_": "support.misbehaving_loggers.Unbuildable", **options}
    with pytest.raises(ValueError) as caught:
        build_loggers({"extra": {"mine": node}}, group="g", name="n")
    message = str(caught.value)
    assert message.startswith(
        "logger.extra.mine: support.misbehaving_loggers.Unbuildable could not be built ("
    ), message
    assert error in message and "\n" not in message
    assert user_error_line(caught.value) == message  # the job's one error line, no traceback


def test_what_a_call_changes_of_the_process_that_training_reads_is_put_back(tmp_path, caplog):
    guarded = GuardedLogger("global", ChangesProcessState("none"))
    (tmp_path / "run").mkdir()
    guarded.start(tmp_path / "run", {}, None, ())
    cwd, random_state = os.getcwd(), torch.get_rng_state()
    guarded.log({"epoch": 1}, 1)
    assert torch.get_default_dtype() == torch.float32  # the model built next is float32
    assert torch.equal(torch.get_rng_state(), random_state) and os.getcwd() == cwd
    guarded.log({"epoch": 2}, 2)  # put back again, without a second warning
    assert torch.get_default_dtype() == torch.float32
    (record,) = [r for r in caplog.records if "logger.extra.global" in r.getMessage()]
    assert record.getMessage() == (
        "logger.extra.global: log changed torch default dtype, torch random state, working "
        "directory; put back (a logger must not change what training reads)"
    )
    assert guarded.failure is None  # not a failure: it is called again


class Warns(MisbehavingLogger):
    def log(self, row, epoch):
        warnings.warn("W&B disabled for the rest of this job (no key)\nmore", stacklevel=2)


def test_a_warning_of_a_call_is_one_line_naming_the_logger(tmp_path, caplog, capsys):
    guarded = GuardedLogger("wandb", Warns("none"))
    guarded.log({"epoch": 1}, 1)
    assert [r.getMessage() for r in caplog.records] == [
        "logger.wandb: W&B disabled for the rest of this job (no key)"
    ]
    assert capsys.readouterr().err == ""  # not Python's warning with a quoted source line


def test_a_call_that_hangs_is_abandoned_after_its_bound(tmp_path, caplog):
    guarded = GuardedLogger("slow", MisbehavingLogger("hang", at="log"), timeout_s=0.3)
    assert guarded.start(tmp_path, {"optimizer": {}}, None, ()) == "bad-1"
    began = time.monotonic()
    guarded.log({"epoch": 1}, 1)
    assert time.monotonic() - began < 5
    guarded.log({"epoch": 2}, 2)  # skipped: no second wait, no second warning
    assert time.monotonic() - began < 5
    (record,) = [r for r in caplog.records if "logger.extra.slow" in r.getMessage()]
    assert "log failed: abandoned (no answer in 0.3 s)" in record.getMessage()


@pytest.mark.slow
def test_sigterm_during_a_hung_logger_call_stops_the_job_at_once(tmp_path):
    run_dir = tmp_path / "run"
    path = os.pathsep.join([str(REPO_ROOT / "tests"), os.environ.get("PYTHONPATH", "")])
    args = [*SMALL, f"hydra.run.dir={run_dir}", *overrides("bad", "hang", "log")]
    job = Job(args, tmp_path, cli_env(OMP_NUM_THREADS="1", PYTHONPATH=path))
    events = run_dir / "bad.events"
    deadline = time.monotonic() + 240
    while not (events.exists() and '"log"' in events.read_text()):  # epoch 1's call hangs
        assert job.process.poll() is None and time.monotonic() < deadline, job.finish()
        time.sleep(0.1)
    job.process.send_signal(signal.SIGTERM)
    code, output = job.finish(timeout=30)
    assert code == 128 + signal.SIGTERM, output
    assert "logger.extra.bad: log failed: abandoned (a stop signal arrived)" in output
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "interrupted"
