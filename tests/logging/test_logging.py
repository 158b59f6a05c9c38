"""The local store, the atomic writers, and the W&B logger + reader (real W&B, offline mode)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import warnings

import pytest
import torch
from omegaconf import OmegaConf
from support import REPO_ROOT
from support.wandb_reader import read_offline_run, read_offline_runs

from grab_exp.logging import (
    LocalStore,
    WandbLogger,
    WandbUnavailableWarning,
    atomic_torch_save,
    atomic_write_text,
    build_wandb_logger,
    library_versions,
    read_json,
    resolve_mode,
    write_json,
)
from grab_exp.logging.local import git_commit

CONF_LOGGER = REPO_ROOT / "conf" / "logger"
COLUMNS = ["train/loss", "train/acc", "mem/peak_cuda_mb", "time/epoch_s"]


@pytest.fixture(scope="session")
def wandb_home(tmp_path_factory):
    return tmp_path_factory.mktemp("wandb_home")


@pytest.fixture(autouse=True)
def wandb_env(wandb_home, monkeypatch):
    """Keep W&B away from ~/.config, ~/.cache, ~/.netrc and the network."""
    for name in ("DIR", "CONFIG_DIR", "CACHE_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        monkeypatch.setenv(f"WANDB_{name}", str(wandb_home / name.lower()))
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_ERROR_REPORTING", "false")
    monkeypatch.setenv("NETRC", str(wandb_home / "no-netrc"))
    for name in ("WANDB_MODE", "WANDB_API_KEY", "WANDB_BASE_URL", "WANDB_IDENTITY_TOKEN_FILE"):
        monkeypatch.delenv(name, raising=False)


def epoch_metrics(epoch: int) -> dict:
    return {
        "epoch": epoch,
        "train/loss": 2.0 / (epoch + 1),
        "train/acc": 0.1 * epoch + 0.05,
        "mem/peak_cuda_mb": None,
        "time/epoch_s": 1.5 + epoch,
    }


# ------------------------------------------------------------------ atomic files


def test_atomic_write_text_replaces_and_leaves_no_temp_files(tmp_path):
    target = tmp_path / "a.txt"
    atomic_write_text(target, "first\n")
    atomic_write_text(target, "second\n")
    assert target.read_text() == "second\n"
    assert os.listdir(tmp_path) == ["a.txt"]


def test_failed_atomic_writes_keep_the_old_file_whole(tmp_path):
    target = tmp_path / "ckpt.pt"
    atomic_torch_save({"w": torch.arange(3)}, target)
    before = target.read_bytes()
    with pytest.raises(Exception):  # noqa: B017 -- a lambda cannot be pickled
        atomic_torch_save({"w": torch.zeros(10_000), "f": lambda: 0}, target)
    assert target.read_bytes() == before
    with pytest.raises(TypeError):
        atomic_write_text(tmp_path / "t.txt", 123)  # type: ignore[arg-type]
    assert sorted(os.listdir(tmp_path)) == ["ckpt.pt"]
    loaded = torch.load(target, weights_only=True)
    assert torch.equal(loaded["w"], torch.arange(3))


def test_read_json_absent_and_strict_json(tmp_path):
    assert read_json(tmp_path / "missing.json") is None
    data = {"a": float("nan"), "b": [1.5, float("inf")], "t": torch.tensor(2.5)}
    write_json(tmp_path / "x.json", data)
    text = (tmp_path / "x.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert read_json(tmp_path / "x.json") == {"a": None, "b": [1.5, None], "t": 2.5}


# ------------------------------------------------------------------ metrics.csv


def test_local_store_round_trip_with_none_cells(tmp_path):
    store = LocalStore(tmp_path / "run", [*COLUMNS, "epoch"])
    assert store.columns[0] == "epoch"
    rows = [epoch_metrics(e) for e in range(3)]
    for row in rows:
        store.append(row)
    lines = store.metrics_path.read_text().splitlines()
    assert lines[0] == "epoch,train/loss,train/acc,mem/peak_cuda_mb,time/epoch_s"
    assert len(lines) == 4 and lines[1].split(",")[3] == ""
    assert store.read_metrics() == rows
    exact = 0.1 + 0.2
    store.append({"epoch": 3, "train/loss": exact, "train/acc": 1e-300})
    assert store.read_metrics()[-1] == {
        "epoch": 3,
        "train/loss": exact,
        "train/acc": 1e-300,
        "mem/peak_cuda_mb": None,
        "time/epoch_s": None,
    }


def test_rewrite_matches_appends_and_drops_rows_after_the_checkpoint(tmp_path):
    rows = [epoch_metrics(e) for e in range(4)]
    appended = LocalStore(tmp_path / "a", COLUMNS)
    for row in rows:
        appended.append(row)
    resumed = LocalStore(tmp_path / "b", COLUMNS)
    for row in rows:
        resumed.append(row)
    with open(resumed.metrics_path, "a") as handle:  # a row half-written when the job died
        handle.write("4,0.3")
    resumed.rewrite(rows[:3])
    resumed.append(rows[3])
    assert resumed.metrics_path.read_bytes() == appended.metrics_path.read_bytes()
    assert os.listdir(tmp_path / "b") == ["metrics.csv"]


def test_append_rejects_bad_rows_and_foreign_headers(tmp_path):
    store = LocalStore(tmp_path, COLUMNS)
    with pytest.raises(ValueError, match="unknown columns"):
        store.append({"epoch": 0, "test/acc": 1.0})
    with pytest.raises(ValueError, match="epoch"):
        store.append({"train/loss": 1.0})
    (tmp_path / "metrics.csv").write_text("epoch,other\n0,1\n")
    with pytest.raises(ValueError, match="header"):
        LocalStore(tmp_path, COLUMNS).append(epoch_metrics(1))


# ------------------------------------------------------------------ summary.json


def test_summary_merges_and_stamps(tmp_path):
    store = LocalStore(tmp_path, COLUMNS)
    assert store.read_summary() is None
    store.write_summary("running", device="cpu", wall_time_s=None)
    summary = store.write_summary("finished", final_metrics={"test/acc": 0.5}, wall_time_s=12.5)
    assert store.read_summary() == summary
    assert summary["status"] == "finished" and summary["device"] == "cpu"
    assert summary["final_metrics"] == {"test/acc": 0.5} and summary["wall_time_s"] == 12.5
    assert set(summary["library_versions"]) == {"python", "torch", "torchvision", "hydra", "wandb"}
    assert summary["library_versions"]["torch"] is not None
    commit = summary["git_commit"]
    assert commit is None or re.fullmatch(r"[0-9a-f]{40}", commit)
    assert commit == git_commit() and summary["library_versions"] == library_versions()
    assert set(summary["machine"]) == {"cpu", "cpu_count", "memory_gib", "platform"}
    assert summary["machine"]["cpu_count"] == os.cpu_count() and summary["machine"]["cpu"]
    with pytest.raises(ValueError, match="running"):
        store.write_summary("done")
    assert os.listdir(tmp_path) == ["summary.json"]


# ------------------------------------------------------------------ W&B mode and config


def test_invalid_mode_raises_at_construction():
    with pytest.raises(ValueError, match=r"logger\.wandb\.mode.*auto, disabled, offline, online"):
        WandbLogger(mode="cloud")


def test_auto_mode_follows_credentials(tmp_path, monkeypatch):
    assert resolve_mode("auto") == "offline"
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert resolve_mode("auto") == "disabled"
    assert resolve_mode("offline") == "offline"
    monkeypatch.delenv("WANDB_MODE")
    netrc = tmp_path / "netrc"
    netrc.write_text(f"machine wandb.example.org\n  login user\n  password {'k' * 40}\n")
    monkeypatch.setenv("NETRC", str(netrc))
    assert resolve_mode("auto") == "offline"  # the key is for another host
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.example.org")
    assert resolve_mode("auto") == "online"
    monkeypatch.delenv("WANDB_BASE_URL")
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert WandbLogger(mode="auto").mode == "online"


def test_logger_yaml_options_are_commented_and_build():
    for path in sorted(CONF_LOGGER.glob("*.yaml")):
        for line in path.read_text().splitlines():
            if re.match(r"\s*[\w_]+:\s*\S", line):
                assert "#" in line, f"{path.name}: key without a comment: {line!r}"
    assert build_wandb_logger(OmegaConf.load(CONF_LOGGER / "local.yaml").wandb, "g", "n") is None
    node = OmegaConf.load(CONF_LOGGER / "wandb.yaml").wandb
    logger = build_wandb_logger(node, "table1", "mean-functional-0")
    assert isinstance(logger, WandbLogger)
    assert (logger.project, logger.mode, logger.group) == ("grab-exp", "offline", "table1")
    node.mode = "sometimes"
    with pytest.raises(ValueError, match=r"logger\.wandb\.mode"):
        build_wandb_logger(node, "g", "n")


# ------------------------------------------------------------------ W&B offline runs


def run_epochs(logger: WandbLogger, epochs: range) -> None:
    for epoch in epochs:
        logger.log(epoch_metrics(epoch), epoch=epoch)


def assert_history(run: dict, epochs: range) -> None:
    assert [row["_step"] for row in run["history"]] == list(epochs)
    for row in run["history"]:
        expected = {k: v for k, v in epoch_metrics(row["_step"]).items() if v is not None}
        assert {k: row[k] for k in expected} == pytest.approx(expected)
        assert "mem/peak_cuda_mb" not in row


def test_offline_run_reads_back_every_epoch(tmp_path):
    config = OmegaConf.create({"seed": 7, "optimizer": {"lr": 0.001}, "lr2": "${optimizer.lr}"})
    logger = WandbLogger(mode="offline", group="table1", name="mean-functional-7", tags=["t"])
    run_id = logger.start(tmp_path, config)
    assert run_id and logger.start(tmp_path, config) == run_id  # one run per job
    run_epochs(logger, range(3))
    logger.finish("finished")
    logger.log(epoch_metrics(9), epoch=9)  # after finish: ignored
    run = read_offline_run(tmp_path)
    assert run["run_id"] == run_id and run["exit_code"] == 0
    assert run["config"] == {"seed": 7, "optimizer": {"lr": 0.001}, "lr2": 0.001}
    assert (run["group"], run["name"], run["tags"]) == ("table1", "mean-functional-7", ["t"])
    assert_history(run, range(3))
    assert run["summary"]["train/loss"] == pytest.approx(2.0 / 3)


def test_resumed_run_reads_back_as_one_run(tmp_path):
    first = WandbLogger(mode="offline")
    run_id = first.start(tmp_path, {"seed": 0})
    run_epochs(first, range(3))
    first.finish("failed")
    second = WandbLogger(mode="offline")
    assert second.start(tmp_path, {"seed": 0}, resume_id=run_id) == run_id
    second.log({"epoch": 2, "attempt": 2}, epoch=2)  # a step both attempts logged: later wins
    run_epochs(second, range(3, 5))
    second.finish("finished")
    runs = read_offline_runs(tmp_path)
    assert list(runs) == [run_id]
    run = runs[run_id]
    assert len(run["files"]) == 2 and run["exit_code"] == 0
    assert_history(run, range(5))
    assert [row.get("attempt") for row in run["history"]] == [None, None, 2, None, None]


def test_reader_separates_runs_by_id(tmp_path):
    ids = []
    for _ in range(2):
        logger = WandbLogger(mode="offline")
        ids.append(logger.start(tmp_path, {}))
        run_epochs(logger, range(1))
        logger.finish()
    assert sorted(read_offline_runs(tmp_path)) == sorted(ids)
    with pytest.raises(ValueError, match="one W&B run"):
        read_offline_run(tmp_path)
    with pytest.raises(FileNotFoundError):
        read_offline_run(tmp_path / "nothing")


def test_killed_job_keeps_its_committed_epochs(tmp_path):
    script = f"""
        import os, time
        from grab_exp.logging import WandbLogger
        logger = WandbLogger(mode="offline")
        logger.start({str(tmp_path)!r}, {{}}, resume_id="killed1")
        for epoch in range(2):
            logger.log({{"epoch": epoch, "train/loss": 1.0}}, epoch=epoch)
        time.sleep(2.5)  # longer than the 1 s transaction-log flush interval
        os._exit(9)  # like SIGKILL: no finish, no atexit
    """
    (tmp_path / "tmp").mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}  # W&B's own temp dirs stay in tmp_path
    subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], env=env, check=False, timeout=120
    )
    run = read_offline_run(tmp_path)
    assert [row["_step"] for row in run["history"]] == [0, 1]
    assert run["exit_code"] is None


def test_disabled_mode_opens_nothing(tmp_path):
    logger = WandbLogger(mode="disabled")
    assert logger.start(tmp_path, {}) is None
    run_epochs(logger, range(2))
    logger.finish()
    assert not (tmp_path / "wandb").exists()


def test_init_failure_warns_once_then_no_ops(tmp_path):
    logger = WandbLogger(mode="offline", project="p" * 200)  # W&B rejects > 128 characters
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert logger.start(tmp_path, {"a": 1}) is None
        run_epochs(logger, range(3))
        logger.finish("finished")
        assert logger.start(tmp_path, {"a": 1}) is None
    ours = [w for w in caught if issubclass(w.category, WandbUnavailableWarning)]
    assert len(ours) == 1 and "wandb.init" in str(ours[0].message)
    assert "project" in logger.failure.lower() and not logger.active


def test_log_failure_warns_once_then_no_ops(tmp_path):
    logger = WandbLogger(mode="offline")
    run_id = logger.start(tmp_path, {})
    logger.log(epoch_metrics(0), epoch=0)
    logger.run.finish()  # the run goes away under the logger: the next log raises in W&B
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_epochs(logger, range(1, 4))
        logger.finish("failed")
    ours = [w for w in caught if issubclass(w.category, WandbUnavailableWarning)]
    assert len(ours) == 1 and "wandb.log" in str(ours[0].message)
    assert logger.run_id is None and logger.start(tmp_path, {}) is None
    assert read_offline_run(tmp_path)["run_id"] == run_id


def test_summary_json_is_valid_json(tmp_path):
    store = LocalStore(tmp_path, COLUMNS)
    store.write_summary("failed", final_metrics={"train/loss": float("nan")}, error="NaN loss")
    data = json.loads(store.summary_path.read_text())
    assert data["final_metrics"] == {"train/loss": None} and data["status"] == "failed"


def test_stale_temp_files_of_a_killed_write_are_removed(tmp_path):
    from grab_exp.logging.files import atomic_write_text, remove_stale_temp_files

    atomic_write_text(tmp_path / "summary.json", "{}")
    stale = tmp_path / ".checkpoint.pt.abc123.tmp"  # what a SIGKILL mid-write leaves
    stale.write_bytes(b"partial")
    keep = tmp_path / "notes.tmp"  # not one of ours: no leading dot
    keep.write_text("mine")
    assert remove_stale_temp_files(tmp_path) == [stale]
    assert not stale.exists() and keep.exists() and (tmp_path / "summary.json").exists()
