"""A real Hydra multirun of ``python -m grab_exp``: 2 variants x 2 seeds, local store + W&B offline.

One multirun (and one re-run of the same command) in a temporary folder serves every test here.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from support.grab_run import grab_env, run_grab
from support.run_files import METRIC_COLUMNS, read_rows, run_dirs, temp_files
from support.wandb_reader import read_offline_runs

pytestmark = pytest.mark.slow

EPOCHS = 2
COMMAND = [
    "-m",
    "experiment=smoke",
    "balance=mean,pair",
    "seed=0,1",
    "logger=wandb",
    "dataset.num_train=256",
    "dataset.num_test=128",
    "progress=line",
    "device=cpu",  # the rows below are CPU rows, whatever the machine
]
JOBS = {(variant, seed) for variant in ("mean", "pair") for seed in (0, 1)}
RUN_DIR = re.compile(r"outputs/smoke/(mean|pair)/seed([01])-[0-9a-f]{8}")  # hash of the overrides


def _snapshot(cwd: Path) -> dict[str, bytes]:
    """Bytes of every file a skipped job must leave alone (W&B files included)."""
    files = [p for p in (cwd / "outputs").rglob("*") if p.is_file()]
    kept = [p for p in files if p.name != "__main__.log" and ".hydra" not in p.parts]
    return {str(p.relative_to(cwd)): p.read_bytes() for p in kept}


@pytest.fixture(scope="module")
def multirun(tmp_path_factory):
    """Run the multirun, snapshot its files, run the same command again."""
    cwd = tmp_path_factory.mktemp("multirun")
    env = grab_env(cwd)
    first = run_grab(COMMAND, cwd, env)
    assert first.returncode == 0, first.stdout
    before = _snapshot(cwd)
    again = run_grab(COMMAND, cwd, env)
    return {"cwd": cwd, "first": first, "before": before, "again": again}


def _job_of(run_dir: Path, cwd: Path) -> tuple[str, int]:
    match = RUN_DIR.fullmatch(run_dir.relative_to(cwd).as_posix())
    assert match, f"unexpected run directory {run_dir}"
    return match.group(1), int(match.group(2))


def test_four_run_directories_with_local_store_and_config(multirun):
    cwd = multirun["cwd"]
    dirs = run_dirs(cwd)
    assert {_job_of(d, cwd) for d in dirs} == JOBS and len(dirs) == 4
    assert len({d.name.split("-", 1)[1] for d in dirs}) == 1  # same other settings, same hash
    for run_dir in dirs:
        variant, seed = _job_of(run_dir, cwd)
        header, rows = read_rows(run_dir)
        assert header == METRIC_COLUMNS
        assert [row["epoch"] for row in rows] == list(range(1, EPOCHS + 1))
        for row in rows:
            cuda = ("mem/peak_cuda_mb", "mem/step_peak_cuda_mb")
            assert all(row[k] is not None for k in METRIC_COLUMNS if k not in cuda)
            assert all(row[k] is None for k in cuda)  # CPU
            assert 0.0 <= row["train/acc"] <= 1.0 and 0.0 <= row["test/acc"] <= 1.0
            assert row["time/epoch_s"] > 0 and row["mem/sorter_bytes"] > 0
        summary = json.loads((run_dir / "summary.json").read_text())
        assert summary["status"] == "finished"
        assert summary["final"] == rows[-1]
        assert summary["device"] == "cpu" and summary["seed"] == seed
        assert summary["wall_time_s"] > 0 and summary["library_versions"]["torch"]
        config = OmegaConf.load(run_dir / ".hydra" / "config.yaml")
        assert config.seed == seed and config.epochs == EPOCHS and config.name == "smoke"
        assert config.balance._target_.rsplit(".", 1)[-1].lower() == f"{variant}balance"
        assert config.dataset.num_train == 256 and config.logger.wandb.enabled is True
        assert (run_dir / "checkpoint.pt").is_file()
    assert temp_files(cwd / "outputs") == []


def test_one_wandb_run_per_job_reads_back_every_epoch(multirun):
    cwd = multirun["cwd"]
    runs = read_offline_runs(cwd / "outputs")
    assert len(runs) == 4
    by_dir = {}
    for run in runs.values():
        (file,) = run["files"]  # one attempt each
        by_dir[Path(file).parents[2]] = run
    assert sorted(by_dir) == [d.resolve() for d in run_dirs(cwd)]
    for run_dir, run in by_dir.items():
        variant, seed = _job_of(run_dir, cwd.resolve())
        assert run["group"] == "smoke"
        assert run["name"] == f"{variant}-functional-seed{seed}"
        assert run["project"] == "grab-exp"
        assert run["exit_code"] == 0
        assert run["config"]["seed"] == seed and run["config"]["epochs"] == EPOCHS
        _, rows = read_rows(run_dir)
        assert [h["_step"] for h in run["history"]] == [row["epoch"] for row in rows]
        for logged, row in zip(run["history"], rows, strict=True):
            for column, value in row.items():
                if value is None:
                    assert column not in logged, column
                else:
                    assert logged[column] == value, (run_dir, column)


def test_rerunning_the_command_skips_all_four(multirun):
    cwd, again = multirun["cwd"], multirun["again"]
    assert again.returncode == 0, again.stdout
    skipped = re.findall(
        r"run directory: (outputs/smoke/\S+) \(skipped: it already finished", again.stdout
    )
    assert sorted(skipped) == sorted(d.relative_to(cwd).as_posix() for d in run_dirs(cwd))
    assert "epoch 1/" not in again.stdout and "resuming" not in again.stdout
    after = _snapshot(cwd)
    assert sorted(after) == sorted(multirun["before"])  # no new W&B runs, no new files
    for name, content in multirun["before"].items():
        assert after[name] == content, f"{name} changed"


def test_the_sweep_says_once_how_many_jobs_it_launches(multirun):
    out = multirun["first"].stdout  # stderr merged into it
    assert out.count("Launching 4 jobs locally, one after another") == 1, out
    assert "Launching 1 jobs locally" not in out, out
