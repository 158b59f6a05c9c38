"""Exact resume, from the ordering's state_dict to whole jobs killed and re-run.

* An ordering's state_dict saved mid-epoch, loaded into a fresh instance, continues
  bit-identically to never stopping.
* A job (a real ``python -m grab_exp`` process, CPU) SIGKILLed in the middle of an epoch and
  re-run ends with exactly the metrics, weights and optimizer/sampler state of an uninterrupted
  run, and continues its W&B run.
* Run directories follow the config: same config, same directory; different configs, different
  directories; ``overwrite=true`` keeps the earlier run aside.
* A diverging run stops at the first non-finite loss, keeps the last good checkpoint, marks its
  summary failed and exits non-zero; a W&B failure warns once and the local store carries on.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import signal
import time
from pathlib import Path

import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from support import REPO_ROOT
from support.grab_run import SMOKE, Job, grab_env
from support.helpers import ALL_ORDERINGS, KERNELS, current_order, make, random_grads, run_epochs
from support.run_files import computed, parse_rows, read_rows, run_dirs, temp_files, wait_for
from support.wandb_reader import read_offline_run

from grab_exp.logging.files import DamagedFileError
from grab_exp.runner.rundir.checkpoint import CHECKPOINT_NAME, load_checkpoint, save_checkpoint
from grab_exp.runner.rundir.resolvers import register_resolvers

N, D, B, ORDER_EPOCHS = 37, 3, 4, 4


def build(name, kernel):
    return make(name, N, D, batch_size=B, depth=3, kernel=kernel, c=3.0, seed=7)


def step_range(bal, z, start, stop):
    order = bal.order.clone()
    for s in range(start, stop, B):
        bal.step(z[order[s : min(s + B, stop)]])


def snapshot(bal) -> bytes:
    buf = io.BytesIO()
    torch.save(bal.state_dict(), buf)
    return buf.getvalue()


def restore(bal, blob: bytes) -> None:
    bal.load_state_dict(torch.load(io.BytesIO(blob)))


def interrupted_run(name, kernel, zs, save_epoch, save_pos):
    """Run ORDER_EPOCHS epochs, but at (save_epoch, save_pos) save, keep the old instance going a
    little (it must not affect the saved state), and continue in a fresh instance."""
    bal = build(name, kernel)
    orders = [current_order(bal)]
    for epoch, z in enumerate(zs):
        start = 0
        if epoch == save_epoch:
            step_range(bal, z, 0, save_pos)
            blob = snapshot(bal)
            step_range(bal, z, save_pos, N)  # the old instance runs on, then is dropped
            bal = build(name, kernel)
            restore(bal, blob)
            assert bal.epoch == epoch and current_order(bal) == orders[-1]
            start = save_pos
        step_range(bal, z, start, N)
        bal.set_epoch(epoch + 1)
        orders.append(current_order(bal))
    return orders


@pytest.mark.parametrize(("save_epoch", "save_pos"), [(1, 16), (0, 8), (2, 0), (3, 36)])
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("name", ALL_ORDERINGS)
def test_mid_epoch_resume_is_bit_identical(name, kernel, save_epoch, save_pos):
    zs = random_grads(N, D, ORDER_EPOCHS, seed=3)
    straight = run_epochs(build(name, kernel), zs, B)
    assert interrupted_run(name, kernel, zs, save_epoch, save_pos) == straight


@pytest.mark.parametrize("name", ["mean", "recursive", "recursive_pair"])
def test_resume_restores_the_generator_and_accumulators(name):
    """The state loaded into an instance that has run a different history (other gradients,
    later epoch) still continues exactly like the instance it was saved from."""
    zs = random_grads(N, D, ORDER_EPOCHS, seed=4)
    a = build(name, "probabilistic")
    run_epochs(a, zs[:1], B)
    step_range(a, zs[1], 0, 12)
    blob = snapshot(a)
    b = build(name, "probabilistic")
    run_epochs(b, random_grads(N, D, 3, seed=5), B)
    step_range(b, zs[0], 0, 20)
    restore(b, blob)
    for bal in (a, b):
        step_range(bal, zs[1], 12, N)
        bal.set_epoch(2)
    assert run_epochs(a, zs[2:], B) == run_epochs(b, zs[2:], B)


pytestmark = pytest.mark.slow

CONF = REPO_ROOT / "conf"
EPOCHS = 3
# 512 examples in batches of 16: 32 steps, about a second per epoch on a small CPU
KILLED = [
    *SMOKE,
    f"epochs={EPOCHS}",
    "dataset.num_train=512",
    "dataset.num_test=128",
    "logger=wandb",
]
SHORT = [*SMOKE, "dataset.num_train=256", "dataset.num_test=128"]
# momentum 2 makes SGD's velocity grow like 2^step: finite after epoch 1 (16 steps), NaN in
# epoch 2; the orders of magnitude (not chaotic details) decide the epoch
DIVERGING = [*SHORT, "epochs=3", "optimizer.momentum=2.0"]


def _only_run_dir(cwd: Path) -> Path:
    (run_dir,) = run_dirs(cwd)
    return run_dir


def _checkpoint(run_dir: Path) -> dict:
    return torch.load(run_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=True)


def _assert_same(a, b, where: str = "") -> None:
    """Exact equality of nested checkpoint states (tensors bit for bit)."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype, where
        differ = (a != b) & ~(a.isnan() & b.isnan()) if a.is_floating_point() else a != b
        assert not differ.any(), f"{where}: {int(differ.sum())} of {a.numel()} elements differ"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a, key=str) == sorted(b, key=str), where
        for key in a:
            _assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, where


# ----------------------------------------------------------------- the jobs (run concurrently)

WANDB_DOWN = [*SHORT, "logger=wandb", "logger.wandb.mode=online"]


def _kill_mid_epoch(victim: Job, cwd: Path) -> dict:
    """SIGKILL ``victim`` a moment after its first epoch's row: inside the next epoch."""

    def first_row():
        files = list((cwd / "outputs").rglob("metrics.csv"))
        return files and len(files[0].read_text().splitlines()) >= 2 and files[0].parent

    run_dir = wait_for(first_row, 180, "the first epoch's metrics row", victim)
    # epoch 1 (with its warm-up) took longer than epoch 2 will: a quarter of it, at most 0.2 s
    # (epochs last about a second here), lands inside epoch 2's training
    time.sleep(min(0.2, read_rows(run_dir)[1][0]["time/epoch_s"] / 4))
    os.kill(victim.pid, signal.SIGKILL)
    status, _ = victim.finish()
    return {
        "status": status,
        "rows": read_rows(run_dir)[1],
        "summary": json.loads((run_dir / "summary.json").read_text()),
        "checkpoint_epoch": _checkpoint(run_dir)["epoch"],
    }


def _finished(job: Job) -> dict:
    status, log = job.finish()
    return {"status": status, "log": log, "run_dir": _only_run_dir(job.log_path.parent)}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """Every job of this module, as concurrent processes where they do not depend on each other.

    * ``uninterrupted``: 3 epochs; ``killed``: the same command SIGKILLed inside epoch 2 (or 3)
      and then re-run in its own folder (``resumed``);
    * ``diverging``: SGD that blows up in epoch 2;
    * ``wandb_down``: W&B online without an API key or server; then ``overwrite``: the same
      config again with ``overwrite=true`` (and ``logger=local``, which changes no directory).
    """
    cwd = {name: tmp_path_factory.mktemp(name) for name in ("uninterrupted", "killed")}
    cwd |= {name: tmp_path_factory.mktemp(name) for name in ("diverging", "wandb_down")}
    env = {name: grab_env(folder) for name, folder in cwd.items()}
    env["wandb_down"].pop("WANDB_MODE")
    env["wandb_down"]["WANDB_BASE_URL"] = "http://127.0.0.1:9"  # nothing listens there
    started: list[Job] = []
    try:
        victim = Job(KILLED, cwd["killed"], env["killed"])
        started.append(victim)
        for name, args in (
            ("uninterrupted", KILLED),
            ("diverging", DIVERGING),
            ("wandb_down", WANDB_DOWN),
        ):
            started.append(Job(args, cwd[name], env[name]))
        _, uninterrupted, diverging, wandb_down = started
        results = {"at_kill": _kill_mid_epoch(victim, cwd["killed"])}
        resumed = Job(KILLED, cwd["killed"], env["killed"], log="resumed.log")
        started.append(resumed)
        results["wandb_down"] = _finished(wandb_down)
        run_dir = results["wandb_down"]["run_dir"]
        results["wandb_down"]["files"] = {
            name: (run_dir / name).read_bytes()
            for name in ("metrics.csv", "summary.json", CHECKPOINT_NAME)
        }
        overwrite = Job([*SHORT, "overwrite=true"], cwd["wandb_down"], env["wandb_down"], "ow.log")
        started.append(overwrite)
        for name, job in (
            ("uninterrupted", uninterrupted),
            ("diverging", diverging),
            ("resumed", resumed),
            ("overwrite", overwrite),
        ):
            results[name] = _finished(job)
        return results
    finally:
        for job in started:
            if job.process.poll() is None:
                job.process.kill()
                job.process.wait()


# ----------------------------------------------------------------- (a) SIGKILL mid-epoch, resume


def test_the_kill_interrupted_an_unfinished_epoch(jobs):
    at_kill = jobs["at_kill"]
    assert at_kill["status"] == -signal.SIGKILL
    done = len(at_kill["rows"])
    assert 1 <= done < EPOCHS  # the kill came after epoch 1's row and before the last one
    # the checkpoint is saved just before the row is appended: it may be one epoch ahead
    checkpointed = at_kill["checkpoint_epoch"] + 1
    assert checkpointed in (done, done + 1) and checkpointed < EPOCHS
    assert at_kill["summary"]["status"] == "running"
    log = jobs["resumed"]["log"]
    assert re.search(r"run directory: \S+ \(resumed\)", log), log
    assert re.search(rf"resuming after epoch {checkpointed}\b", log), log


def test_resumed_run_equals_an_uninterrupted_one(jobs):
    assert jobs["uninterrupted"]["status"] == 0, jobs["uninterrupted"]["log"]
    assert jobs["resumed"]["status"] == 0, jobs["resumed"]["log"]
    reference, resumed = jobs["uninterrupted"]["run_dir"], jobs["resumed"]["run_dir"]
    # the same command maps to the same run directory wherever it runs
    assert resumed.relative_to(resumed.parents[3]) == reference.relative_to(reference.parents[3])
    ref_header, ref_rows = read_rows(reference)
    header, rows = read_rows(resumed)
    assert header == ref_header and [r["epoch"] for r in rows] == [1, 2, 3]
    assert computed(rows) == computed(ref_rows)  # losses, accuracies, ordering bytes: exact
    for run_dir in (reference, resumed):
        assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    ref_state, state = _checkpoint(reference), _checkpoint(resumed)
    assert state["epoch"] == ref_state["epoch"] == EPOCHS - 1
    for key in ("model", "optimizer", "ordering"):
        _assert_same(state[key], ref_state[key], key)
    assert computed(state["metrics"]) == computed(ref_state["metrics"])
    assert temp_files(reference) == [] and temp_files(resumed) == []


def test_resumed_job_continues_its_wandb_run(jobs):
    resumed = jobs["resumed"]["run_dir"]
    run = read_offline_run(resumed)  # one run id for both attempts, or it raises
    assert len(run["files"]) == 2  # the killed attempt and the resumed one
    assert run["run_id"] == _checkpoint(resumed)["logger_ids"]["wandb"]
    assert run["run_id"] != read_offline_run(jobs["uninterrupted"]["run_dir"])["run_id"]
    assert run["exit_code"] == 0 and run["name"] == "mean-functional-seed0"
    _, rows = read_rows(resumed)
    assert [h["_step"] for h in run["history"]] == [1, 2, 3]  # each epoch once
    for logged, row in zip(run["history"], rows, strict=True):
        assert {k: logged.get(k) for k in row} == row  # None (CUDA memory on CPU) is not logged


# ----------------------------------------------------------------- (b) run directories


def _run_dir_of(overrides: list[str]) -> str:
    cfg = compose("config", overrides=overrides, return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    return str(cfg.hydra.run.dir)


@contextlib.contextmanager
def _hydra_config():
    """Leave Hydra's global HydraConfig as it was found (``_run_dir_of`` sets it)."""
    previous = HydraConfig.instance().cfg
    try:
        yield
    finally:
        HydraConfig.instance().cfg = previous


def test_run_directory_follows_the_config_only():
    register_resolvers()
    base = ["experiment=smoke", "dataset.num_train=256"]
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"), _hydra_config():
        same = {
            _run_dir_of(base),
            _run_dir_of(list(reversed(base))),
            # where logs go, whether to start over and how progress shows change nothing
            _run_dir_of([*base, "logger=wandb", "logger.wandb.mode=offline"]),
            _run_dir_of([*base, "overwrite=true", "progress=none"]),
        }
        different = [
            _run_dir_of(base),
            _run_dir_of([*base, "epochs=3"]),
            _run_dir_of([*base, "epochs=4"]),
            _run_dir_of([*base, "optimizer.lr=0.01"]),
            _run_dir_of([*base, "optimizer.lr=0.02"]),
            _run_dir_of([*base, "seed=1"]),
            _run_dir_of([*base, "balance=pair"]),
            _run_dir_of([*base, "balance=rr", "pipeline=classic"]),
            _run_dir_of(["experiment=smoke"]),
            _run_dir_of(["experiment=smoke", "name=other"]),
            # another experiment (or none) under the smoke experiment's name: other configs
            _run_dir_of(["experiment=table1", "name=smoke"]),
            _run_dir_of(["name=smoke"]),
        ]
    assert len(same) == 1
    assert len(set(different)) == len(different), different
    assert different[0].startswith("outputs/smoke/mean/seed0-")
    assert different[7].startswith("outputs/smoke/rr-classic/seed0-")
    assert different[8] == "outputs/smoke/mean/seed0"


@pytest.mark.xfail(
    strict=True,
    reason="known gap: the hash covers the override *strings*, not the settings that differ "
    "from the experiment's defaults, so a redundant or respelled override (epochs=2 on smoke, "
    "lr=1e-3 vs lr=0.001) gives the same config a second directory (safe: never a shared one)",
)
def test_redundant_overrides_map_to_the_experiments_directory():
    register_resolvers()
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"), _hydra_config():
        plain = _run_dir_of(["experiment=smoke"])
        redundant = _run_dir_of(["experiment=smoke", "epochs=2", "optimizer.lr=1e-3"])
    assert redundant == plain


def test_overwrite_keeps_the_old_run_aside_and_starts_over(jobs):
    old, new = jobs["wandb_down"], jobs["overwrite"]
    assert new["status"] == 0, new["log"]
    assert new["run_dir"] == old["run_dir"]  # logger=local vs wandb: the same directory
    assert "(skipped" not in new["log"] and "resuming" not in new["log"]
    assert re.search(r"run directory: \S+ \(new\)", new["log"]), new["log"]
    assert "epoch 1/2" in new["log"] and "epoch 2/2" in new["log"]  # trained from scratch
    run_dir = new["run_dir"]
    aside = run_dir.with_name(run_dir.name + ".old1")
    assert re.search(rf"moved to \S+{re.escape(aside.name)}", new["log"]), new["log"]
    assert (aside / ".hydra" / "config.yaml").is_file()
    # the job log: the earlier run's lines moved aside with it, the new one starts with its own
    live, kept = (run_dir / "__main__.log").read_text(), (aside / "__main__.log").read_text()
    assert live.count("run directory:") == 1 and "(new)" in live and "moved to" in live, live
    assert kept.count("run directory:") == 1 and "moved to" not in kept, kept
    for name, content in old["files"].items():
        assert (aside / name).read_bytes() == content, name  # kept, unchanged
    old_rows = read_rows(aside)[1]
    assert computed(read_rows(run_dir)[1]) == computed(old_rows)  # same config, same numbers
    assert (run_dir / "metrics.csv").read_bytes() != old["files"]["metrics.csv"]  # new timings
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"
    assert _checkpoint(run_dir)["epoch"] == 1


# ----------------------------------------------------------------- (c) NaN loss, (d) W&B down


def test_nan_loss_stops_the_run_and_keeps_the_last_good_checkpoint(jobs):
    done = jobs["diverging"]
    assert done["status"] not in (0, None), done["log"]
    message = r"epoch 2: the training loss is -?(nan|inf) \(not finite\)"
    assert re.search(message, done["log"]), done["log"]
    assert "its checkpoint of epoch 1 was kept" in done["log"]  # the one kept, by epoch
    run_dir = done["run_dir"]
    _, rows = read_rows(run_dir)
    assert [row["epoch"] for row in rows] == [1]  # only the good epoch
    state = _checkpoint(run_dir)
    assert state["epoch"] == 0 and computed(state["metrics"]) == computed(rows)
    assert all(torch.isfinite(t).all() for t in state["model"].values())
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["final"]["epoch"] == 1
    assert temp_files(run_dir) == []


def test_wandb_failure_warns_once_and_the_run_finishes(jobs):
    done = jobs["wandb_down"]
    log = done["log"]
    assert done["status"] == 0, log
    assert log.count("W&B disabled for the rest of this job") == 1, log
    assert "metrics still go to the local store" in log
    _, rows = parse_rows(done["files"]["metrics.csv"].decode())
    assert [row["epoch"] for row in rows] == [1, 2]
    state = torch.load(io.BytesIO(done["files"][CHECKPOINT_NAME]), weights_only=True)
    assert state["logger_ids"] == {"wandb": None} and state["epoch"] == 1
    summary = json.loads(done["files"]["summary.json"])
    assert summary["status"] == "finished" and summary["final"]["epoch"] == 2
    assert not list(done["run_dir"].parent.rglob("*.wandb"))  # no W&B run was written


# ----------------------------------------------------------------- checkpoint files


class _Planted:
    """Unpickling this calls ``open(path, "w")``: a full pickle load would create the file."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_checkpoint_loads_with_weights_only(tmp_path):
    marker = tmp_path / "code-ran"
    with open(tmp_path / CHECKPOINT_NAME, "wb") as handle:
        torch.save({"epoch": 0, "rng": {}, "evil": _Planted(marker)}, handle)
    with pytest.raises(DamagedFileError, match=r"a weights-only load refused its content"):
        load_checkpoint(tmp_path)
    assert not marker.exists()  # weights_only=True refused to run the pickled call


def test_checkpoint_is_written_atomically(tmp_path):
    state = {"epoch": 0, "model": {"w": torch.arange(3.0)}}
    save_checkpoint(tmp_path, **state)
    before = (tmp_path / CHECKPOINT_NAME).read_bytes()
    with pytest.raises(Exception, match=r"(?i)pickle"):
        save_checkpoint(tmp_path, epoch=1, model={"w": torch.zeros(3)}, bad=lambda: None)
    assert (tmp_path / CHECKPOINT_NAME).read_bytes() == before  # the old one, whole
    assert sorted(os.listdir(tmp_path)) == [CHECKPOINT_NAME]  # no temp file left
    loaded = load_checkpoint(tmp_path)
    assert loaded["epoch"] == 0 and torch.equal(loaded["model"]["w"], torch.arange(3.0))


def test_a_wandb_runs_checkpoint_refuses_a_changed_nested_setting(grab, grab_here, tmp_path):
    """The checkpoint holds the job's flat config, not the W&B run's nested one: with the summary
    gone, it alone still catches a changed nested setting (``optimizer.momentum``)."""
    run_dir = tmp_path / "run"
    base = [*SMOKE, "dataset.num_test=16", "logger=wandb", f"hydra.run.dir={run_dir}"]
    assert grab_here([*base, "epochs=1"]).returncode == 0
    (run_dir / "summary.json").unlink()  # only the checkpoint is left to tell
    result = grab([*base, "epochs=2", "optimizer.momentum=0.5"])
    assert result.returncode != 0
    assert "optimizer.momentum 0.9 -> 0.5" in result.stdout
