"""``python -m grab_exp.logging upload``: finished local runs into offline W&B, read back by an
independent reader (the ``.wandb`` file's records, tests/support/wandb_reader.py).

One smoke run trained with the local logger only and one with ``logger=wandb`` (offline) serve
the module. The damaged run folders (issue 52, item 5) are copies of the finished run with one
thing wrong each; property: each is refused by name and left byte for byte as it was, the good
run beside them is uploaded with exactly its files, and the command ends with one line per run.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support.grab_run import grab_env, run_in_process
from support.wandb_reader import read_offline_run

from grab_exp.report.collect import RUN_FILES
from grab_exp.runner.rundir.lock import RunLock

SMALL = ["experiment=smoke", "progress=none", "dataset.num_train=128", "dataset.num_test=32"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished run trained without W&B and one trained with ``logger=wandb`` (offline)."""
    cwd = tmp_path_factory.mktemp("upload")
    for name, extra in (("local", []), ("wandb", ["logger=wandb"])):
        done = run_in_process([*SMALL, *extra, f"hydra.run.dir={cwd / name}"], cwd, grab_env(cwd))
        assert done.returncode == 0, done.stdout
    return {"cwd": cwd, "local": cwd / "local", "wandb": cwd / "wandb"}


def _upload(cwd: Path, *args: str, auto: bool = False) -> subprocess.CompletedProcess:
    """The command in ``cwd``; W&B offline, or with ``auto`` as a user without a key has it."""
    env = grab_env(cwd)
    if auto:
        del env["WANDB_MODE"]
    return subprocess.run(
        [sys.executable, "-m", "grab_exp.logging", "upload", *map(str, args)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


def _copy(run_dir: Path, to: Path) -> Path:
    shutil.copytree(run_dir, to, ignore=shutil.ignore_patterns("wandb", "wandb_upload.json"))
    return to


def _snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` (symlinks not followed) by relative path, with its bytes."""
    return {
        str(Path(parent, name).relative_to(folder)): Path(parent, name).read_bytes()
        for parent, _, names in os.walk(folder)
        for name in names
        if not Path(parent, name).is_symlink()
    }


def _sent_files(run_dir: Path) -> dict[str, bytes]:
    """The run's files as the W&B run holds them (its offline folder's ``files/``)."""
    (files,) = (run_dir / "wandb").glob("offline-run-*/files")
    return {name: (files / name).read_bytes() for name in RUN_FILES if (files / name).is_file()}


def test_a_finished_run_uploads_its_history_config_commit_and_exactly_its_files(trained, tmp_path):
    run_dir = _copy(trained["local"], tmp_path / "run")
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["git_commit"] = "0123456789abcdef0123456789abcdef01234567"  # trained elsewhere
    (run_dir / "summary.json").write_text(json.dumps(summary))
    done = _upload(tmp_path, run_dir, auto=True)
    assert done.returncode == 0, done.stderr
    offline, line = done.stdout.strip().splitlines()
    assert offline.startswith("W&B is offline (--mode auto and no W&B API key configured)")
    run = read_offline_run(run_dir / "wandb")
    assert line.startswith(f"{run_dir}: W&B run {run['run_id']} (offline: wandb sync ")
    assert done.stderr == ""
    rows = list(csv.DictReader((run_dir / "metrics.csv").open()))
    assert [r["_step"] for r in run["history"]] == [int(r["epoch"]) for r in rows]
    for logged, row in zip(run["history"], rows, strict=True):
        assert logged["train/loss"] == float(row["train/loss"])  # exactly as written
        assert logged["test/acc"] == float(row["test/acc"])
    assert run["summary"]["status"] == "finished" and run["exit_code"] == 0
    assert (
        run["config"]["optimizer"]["lr"] == summary["config_fingerprint"]["config"]["optimizer.lr"]
    )
    assert run["config"]["git_commit"] == run["git"]["commit"] == summary["git_commit"]
    assert (run["group"], run["name"]) == ("smoke", "mean-functional-seed0")
    sent = _sent_files(run_dir)
    assert sent == {name: (run_dir / name).read_bytes() for name in RUN_FILES}


def test_uploading_again_sends_nothing_and_wandb_folders_are_not_runs(trained, tmp_path):
    run_dir = _copy(trained["local"], tmp_path / "run")
    first = _upload(tmp_path, tmp_path, "--mode", "offline")
    assert first.returncode == 0, first.stderr
    record = json.loads((run_dir / "wandb_upload.json").read_text())
    again = _upload(tmp_path, tmp_path, "--mode", "offline")
    assert again.returncode == 0, again.stderr
    assert again.stdout.strip().splitlines()[1:] == [
        f"{run_dir}: already uploaded as W&B run {record['id']} (offline, "
        f"{record['uploaded_at']}); delete wandb_upload.json to upload it again; nothing sent"
    ]
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1


def test_a_run_logged_with_logger_wandb_is_recognised(trained, tmp_path):
    run_dir = _copy(trained["wandb"], tmp_path / "run")
    logged = read_offline_run(trained["wandb"] / "wandb")["run_id"]
    done = _upload(tmp_path, run_dir, "--mode", "offline")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == (
        f"{run_dir}: logged to W&B as run {logged} while it trained (logger=wandb); an offline "
        "one goes up with: wandb sync run/wandb; nothing sent"
    )
    assert not (run_dir / "wandb").exists()


def _half_row(run_dir: Path) -> None:
    text = (run_dir / "metrics.csv").read_text()
    (run_dir / "metrics.csv").write_text(text[: text.rindex(".") + 2])  # 0.25 -> 0.2, cut


def _missing_epoch(run_dir: Path) -> None:
    header, _first, *rest = (run_dir / "metrics.csv").read_text().splitlines(keepends=True)
    (run_dir / "metrics.csv").write_text(header + "".join(rest))


def _status(status: str):
    def damage(run_dir: Path) -> None:
        summary = json.loads((run_dir / "summary.json").read_text())
        (run_dir / "summary.json").write_text(json.dumps({**summary, "status": status}))

    return damage


def _final_differs(run_dir: Path) -> None:
    summary = json.loads((run_dir / "summary.json").read_text())
    summary["final"]["test/acc"] += 0.05
    (run_dir / "summary.json").write_text(json.dumps(summary))


#: damage -> (what it does to a copy of a finished run, the words its refusal holds)
DAMAGES = {
    "half_row": (_half_row, "incomplete metrics.csv (it ends in half a row"),
    "missing_epoch": (_missing_epoch, "corrupt metrics.csv (epochs"),
    "no_metrics": (lambda d: (d / "metrics.csv").unlink(), "no metrics.csv"),
    "running": (_status("running"), "(status 'running'): no job holds it (killed or crashed)"),
    "final_differs": (_final_differs, "last row differs from summary.json's final row"),
    "no_summary_json": (lambda d: (d / "summary.json").write_text("{"), "unreadable summary"),
}


def test_damaged_run_folders_are_refused_by_name_and_left_as_they_were(trained, tmp_path):
    root = tmp_path / "runs"
    good = _copy(trained["local"], root / "good")
    damaged = {}
    for name, (damage, words) in DAMAGES.items():
        damage(_copy(trained["local"], root / name))
        damaged[name] = words
    busy = _copy(trained["local"], root / "busy")
    (root / "link").symlink_to(good, target_is_directory=True)  # the good run once, not twice
    (root / "loop").symlink_to(root, target_is_directory=True)  # a cycle ends
    before = _snapshot(root)
    lock = RunLock(busy)
    lock.acquire()
    try:
        done = _upload(tmp_path, root, "--mode", "offline")
    finally:
        lock.release()
    assert done.returncode == 1, done.stdout + done.stderr
    refused = done.stderr.strip().splitlines()
    assert len(refused) == len(DAMAGES) + 1, done.stderr
    for name, words in {**damaged, "busy": "is in use by pid"}.items():
        (line,) = [line for line in refused if line.startswith(f"{root / name}: refused: ")]
        assert words in line, line
    assert done.stdout.strip().splitlines()[1:] == [
        line for line in done.stdout.strip().splitlines()[1:] if line.startswith(f"{good}: W&B")
    ]
    assert len(done.stdout.strip().splitlines()) == 2  # the offline line, the good run's
    sent = _sent_files(good)
    assert sent == {name: (good / name).read_bytes() for name in RUN_FILES}
    after = _snapshot(root)
    assert {k: v for k, v in after.items() if not k.startswith("good/")} == {
        k: v for k, v in before.items() if not k.startswith("good/")
    }
    assert not any((root / name / "wandb").exists() for name in [*DAMAGES, "busy"])
    assert os.path.islink(root / "link")


@pytest.mark.slow
def test_online_without_a_key_is_one_line_per_run_printed_once(trained, tmp_path):
    run_dir = _copy(trained["local"], tmp_path / "run")
    done = _upload(tmp_path, run_dir, "--mode", "online", auto=True)
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"{run_dir}: refused: wandb.init failed: UsageError: No API key configured. Use "
        "`wandb login` to log in."
    ]
    assert not (run_dir / "wandb_upload.json").exists()
