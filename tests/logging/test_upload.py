"""``python -m grab_exp.logging upload``: a finished local run into offline W&B, read back by
an independent reader (the ``.wandb`` file's records, tests/support/wandb_reader.py)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import pytest
from support.grab_run import grab_env, run_grab
from support.wandb_reader import read_offline_run


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """A smoke job trained with the local logger only."""
    cwd = tmp_path_factory.mktemp("upload")
    run_dir = cwd / "run"
    done = run_grab(
        ["experiment=smoke", "progress=none", f"hydra.run.dir={run_dir}"], cwd, grab_env(cwd)
    )
    assert done.returncode == 0, done.stdout
    return {"cwd": cwd, "run_dir": run_dir}


def _upload(finished, *args: str) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "grab_exp.logging", "upload", *args]
    env = grab_env(finished["cwd"])
    return subprocess.run(
        command,
        cwd=finished["cwd"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.slow
def test_a_finished_run_uploads_with_its_history_config_summary_and_files(finished, tmp_path):
    done = _upload(finished, str(finished["cwd"]), "--mode", "offline", "--dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    run_dir = finished["run_dir"]
    (line,) = done.stdout.strip().splitlines()
    run = read_offline_run(tmp_path)
    assert line == f"{run_dir}: W&B run {run['run_id']}"
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [r["_step"] for r in run["history"]] == [int(r["epoch"]) for r in rows]
    for logged, row in zip(run["history"], rows, strict=True):
        assert logged["train/loss"] == pytest.approx(float(row["train/loss"]))
        assert logged["test/acc"] == pytest.approx(float(row["test/acc"]))
    summary = json.loads((run_dir / "summary.json").read_text())
    assert run["summary"]["status"] == "finished"
    assert run["summary"]["wall_time_s"] == pytest.approx(summary["wall_time_s"])
    assert run["config"]["identity"]["variant"] == "mean"
    assert (
        run["config"]["optimizer"]["lr"] == summary["config_fingerprint"]["config"]["optimizer.lr"]
    )
    assert (run["group"], run["name"]) == ("smoke", "mean-functional-seed0")
    assert {"metrics.csv", "summary.json"} <= {f.rsplit("/", 1)[-1] for f in run["files"]} or run[
        "files"
    ]
    assert run["exit_code"] == 0


def test_an_unfinished_run_is_refused_in_one_line(tmp_path):
    run_dir = tmp_path / "half"
    run_dir.mkdir()
    (run_dir / "summary.json").write_text(json.dumps({"status": "interrupted"}))
    done = subprocess.run(
        [sys.executable, "-m", "grab_exp.logging", "upload", str(tmp_path), "--mode", "offline"],
        capture_output=True, text=True, timeout=120, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {run_dir}: the run is 'interrupted', not finished")
    assert not (run_dir / "wandb").exists()
