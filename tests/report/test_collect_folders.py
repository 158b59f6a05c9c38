"""Where the one reader of runs looks (:func:`grab_exp.report.collect.find_run_dirs`): W&B's own
folders, which hold copies of a run's files after an upload, are never runs or orphans; a
symlinked run folder is found, once; a link back up ends."""

from __future__ import annotations

import warnings
from pathlib import Path

from grab_exp.report.collect import find_run_dirs


def _run_files(folder: Path) -> Path:
    (folder / ".hydra").mkdir(parents=True)
    for name in ("summary.json", "metrics.csv", ".hydra/config.yaml"):
        (folder / name).write_text("{}")
    return folder


def test_wandb_folders_are_skipped_and_symlinks_followed_once(tmp_path):
    run = _run_files(tmp_path / "sweep" / "mean" / "seed0")
    _run_files(run / "wandb" / "offline-run-20261205_162433-ae3574e2474deb75" / "files")
    _run_files(tmp_path / "sweep" / "wandb" / "run-20261205_162433-abc" / "files")
    elsewhere = _run_files(tmp_path / "elsewhere" / "seed1")
    (tmp_path / "sweep" / "linked").symlink_to(elsewhere, target_is_directory=True)
    (tmp_path / "sweep" / "again").symlink_to(run, target_is_directory=True)
    (tmp_path / "sweep" / "mean" / "up").symlink_to(tmp_path / "sweep", target_is_directory=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        found = find_run_dirs([tmp_path / "sweep"])
    assert found == sorted([run.resolve(), elsewhere.resolve()])
    assert [str(w.message) for w in caught] == []
