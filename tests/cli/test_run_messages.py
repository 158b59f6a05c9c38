"""What ``python -m grab_exp`` tells its user: where it writes, W&B offline and how to upload,
the sweep presets run without ``-m``, and ``--help``."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support.grab_run import CONF_DIR, grab_env, run_cli, run_grab

SMALL_RUN = ("experiment=smoke", "dataset.num_test=16", "progress=line")
DIR_LINE = re.compile(r"run directory: (\S+) \((new|resumed|skipped)")


@pytest.fixture(scope="module")
def offline_wandb_run(tmp_path_factory):
    """A smoke job with offline W&B, then the same job again with the local logger only."""
    cwd = tmp_path_factory.mktemp("offline")
    env = grab_env(cwd)
    env.pop("WANDB_MODE")  # logger.wandb.mode=auto without an API key: offline
    first = run_grab([*SMALL_RUN, "logger=wandb"], cwd, env)
    hydra_dir = Path(cwd, DIR_LINE.search(first.stdout)[1], ".hydra")
    before = {p.name: p.read_bytes() for p in hydra_dir.iterdir()}
    again = run_grab(SMALL_RUN, cwd, env)
    return {"cwd": cwd, "first": first, "again": again, "hydra_dir": hydra_dir, "before": before}


def test_a_run_prints_its_directory_before_training(offline_wandb_run):
    out = offline_wandb_run["first"].stdout
    assert offline_wandb_run["first"].returncode == 0, out
    match = DIR_LINE.search(out)
    assert match and match[2] == "new", out
    assert match.start() < out.index("epoch 1/")
    assert (offline_wandb_run["cwd"] / match[1] / "summary.json").is_file()


def test_a_run_says_what_it_trains_shows_progress_early_and_ends_with_its_results(
    offline_wandb_run,
):
    """Start line (ordering, model, dataset, epochs, device), a step line early in the first
    epoch (no terminal: progress=line), and an end line with the final metrics and directory."""
    out = offline_wandb_run["first"].stdout
    run_dir = DIR_LINE.search(out)[1]
    start = re.search(
        r"job: ordering mean \(functional pipeline\), model LeNet \(62,006 parameters\), "
        r"dataset synthetic \(2,048 train / 16 test\), 2 epochs of batch 16, seed 0, device cpu",
        out,
    )
    assert start, out
    step = re.search(r"epoch 1/2  step 10/128  \d+\.\ds", out)
    assert step and start.start() < step.start() < out.index("epoch 1/2  train/loss"), out
    summary = json.loads(Path(offline_wandb_run["cwd"], run_dir, "summary.json").read_text())
    final = summary["final"]
    end = re.search(
        rf"finished after epoch 2: train/loss {final['train/loss']:.4f}  "
        rf"test/acc {final['test/acc']:.4f}  wall time (\d+m \d\ds|\d+\.\ds); "
        rf"results in {re.escape(run_dir)}\n",
        out,
    )
    assert end and end.start() > out.index("epoch 2/2  train/loss"), out


def test_offline_wandb_says_so_once_and_prints_the_sync_command(offline_wandb_run):
    out, cwd = offline_wandb_run["first"].stdout, offline_wandb_run["cwd"]
    why = "logger.wandb.mode=auto and no W&B API key configured"
    assert out.count(f"W&B is offline ({why})") == 1, out
    (sync_dir,) = re.findall(r"upload this W&B run with: wandb sync (\S+)", out)
    assert out.rindex("wandb sync") > out.rindex("epoch 2/2")
    run_dir = DIR_LINE.search(out)[1]
    assert Path(sync_dir).parent == Path(run_dir, "wandb")
    assert list((cwd / sync_dir).glob("run-*.wandb")), "the folder to sync holds the W&B run"


def test_a_skipped_run_keeps_its_hydra_files(offline_wandb_run):
    again = offline_wandb_run["again"]
    assert again.returncode == 0, again.stdout
    assert "(skipped: it already finished" in again.stdout and "epoch 1/" not in again.stdout
    hydra_dir = offline_wandb_run["hydra_dir"]
    after = {p.name: p.read_bytes() for p in hydra_dir.iterdir()}
    assert after == offline_wandb_run["before"]
    assert b"logger=wandb" in after["overrides.yaml"]  # still the command that made the run


def test_a_sweep_preset_without_m_warns_with_its_job_count(tmp_path):
    small = ("dataset=synthetic", "dataset.num_train=64", "dataset.num_test=16", "epochs=1")
    done = run_cli(["experiment=table1", *small, "progress=none"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stdout.splitlines() if "without -m" in line]
    assert len(lines) == 1 and "a sweep of 21 jobs (row x seed)" in lines[0], done.stdout


def test_help_describes_the_tool_its_groups_and_examples(tmp_path):
    done = run_cli(["--help"], tmp_path)
    assert done.returncode == 0, done.stderr
    text = done.stdout
    assert text.startswith("python -m grab_exp: train") and "powered by Hydra" not in text
    groups = dict(re.findall(r"^([a-z_/]+): (.+)$", text, flags=re.M))
    assert not [g for g in groups if "/" in g], "an internal (nested) group is listed"
    for group in ("model", "dataset", "optimizer", "balance", "pipeline", "logger", "row"):
        options = sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))
        assert groups[group].split(", ") == options, group
    launchers = text.split("== Launchers (hydra/launcher=...) ==\n")[1].splitlines()[0]
    named = {part.split(" (")[0] for part in launchers.split("), ")}
    assert named == {"basic"} | {p.stem for p in (CONF_DIR / "hydra" / "launcher").glob("*")}
    examples = text.split("== Examples ==\n")[1].split("\n\n")[0].splitlines()
    assert len(examples) == 3 and all("python -m grab_exp" in line for line in examples)
