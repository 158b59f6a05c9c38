"""What a job refused before its run started leaves: nothing of its own, nothing of others."""

from __future__ import annotations

from pathlib import Path

from grab_exp.runner.rundir.state import JOB_STUB, mark_job_log_start, remove_refused_job


def _stub(run_dir: Path) -> None:
    """What Hydra and the job write before the run starts."""
    mark_job_log_start(run_dir)
    for name in JOB_STUB:
        (run_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (run_dir / name).write_text("x")


def test_the_stub_and_the_folders_it_emptied_go_up_to_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "outputs" / "keep.txt").parent.mkdir()
    (tmp_path / "outputs" / "keep.txt").write_text("the user's")
    run_dir = tmp_path / "outputs" / "exp" / "mean" / "seed0"
    _stub(run_dir)
    remove_refused_job(run_dir)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "outputs",
        "outputs/keep.txt",
    ]


def test_a_folder_with_an_earlier_run_or_log_is_left_as_it_was(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    finished, logged = tmp_path / "finished", tmp_path / "logged"
    finished.mkdir()
    (finished / "summary.json").write_text("{}")
    logged.mkdir()
    (logged / "__main__.log").write_text("an earlier job's lines\n")
    for run_dir in (finished, logged):
        _stub(run_dir)
        before = sorted(run_dir.rglob("*"))
        remove_refused_job(run_dir)
        assert sorted(run_dir.rglob("*")) == before


def test_the_working_folder_itself_stays(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # hydra.run.dir=.
    _stub(tmp_path)
    remove_refused_job(tmp_path)
    assert tmp_path.is_dir() and not any(tmp_path.iterdir())
