"""``runner.rundir.identity.read_identity`` through the report's reader: the runner's identity
block, the same dict derived for runs written before it (the committed ``results/``), and W&B
runs identified from their config."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from grab_exp.report import ReportWarning, read_api_runs, read_runs, runs_frame
from grab_exp.runner.rundir.identity import IDENTITY_KEYS, read_identity

RESULTS = Path(__file__).resolve().parents[2] / "results"
BASE = {"arm": None, "row": None, "world_size": 1, "overrides_hash": ""}
LEGACY = {  # committed run -> the identity the runner now writes for such a run
    "table1-5-epochs/runs/rr-classic/seed0-49b0123a": BASE
    | {"experiment": "table1", "variant": "rr", "pipeline": "classic", "optimizer": "sgd",
       "row": "rr_classic", "batch_size": 16, "seed": 0, "overrides_hash": "49b0123a"},
    "table1-5-epochs/runs/recursive_pair/seed42-49b0123a": BASE
    | {"experiment": "table1", "variant": "recursive_pair", "pipeline": "functional",
       "optimizer": "sgd", "row": "recursive_pair", "batch_size": 16, "seed": 42,
       "overrides_hash": "49b0123a"},
    "vrgd/runs/vr_adam/batch4096/seed7": BASE
    | {"experiment": "vrgd_large_batch", "variant": "rr", "pipeline": "functional",
       "optimizer": "vr_adam", "arm": "vr_adam", "batch_size": 4096, "seed": 7},
    "vrgd/runs/sgd_momentum/batch256/seed0": BASE
    | {"experiment": "vrgd_large_batch", "variant": "rr", "pipeline": "classic",
       "optimizer": "sgd", "arm": "sgd_momentum", "batch_size": 256, "seed": 0},
    "distributed/runs/d_grab/seed0-9c7fb266": BASE
    | {"experiment": "distributed", "variant": "d_grab", "pipeline": "functional",
       "optimizer": "sgd", "batch_size": 16, "world_size": 2, "seed": 0,
       "overrides_hash": "9c7fb266"},
}  # fmt: skip


def copy_run(relative: str, tmp_path: Path) -> Path:
    source = RESULTS / relative
    if not source.is_dir():
        pytest.skip(f"no committed run {relative}")
    target = tmp_path / Path(relative).name  # the hash lives in the directory's name
    shutil.copytree(source, target)
    return target


@pytest.mark.parametrize("relative", list(LEGACY))
def test_legacy_run_and_identity_block_give_the_same_identity(relative, tmp_path):
    legacy = copy_run(relative, tmp_path / "legacy")
    summary = json.loads((legacy / "summary.json").read_text())
    assert "identity" not in summary  # written before the block existed
    ((frame, identity),) = read_runs([legacy])
    assert identity == LEGACY[relative] and list(identity) == list(IDENTITY_KEYS)
    # the same run as the runner writes it now: the block, and no Hydra files needed
    new = copy_run(relative, tmp_path / "new")
    (new / "summary.json").write_text(json.dumps({**summary, "identity": LEGACY[relative]}))
    shutil.rmtree(new / ".hydra")
    ((new_frame, new_identity),) = read_runs([new])
    assert new_identity == identity
    columns = ["variant", "pipeline", "seed", "epoch", "train/loss"]
    assert new_frame[columns].equals(frame[columns])


def test_the_block_wins_over_the_old_summary_fields():
    block = LEGACY["vrgd/runs/vr_adam/batch4096/seed7"] | {"variant": "mean"}
    summary = {"variant": "rr", "pipeline": "classic", "seed": 3, "identity": block}
    assert read_identity(summary) == block


def test_an_old_summary_without_hydra_files_leaves_the_unknown_keys_none(tmp_path):
    run_dir = tmp_path / "seed3"
    run_dir.mkdir()
    identity = read_identity(
        {"variant": "mean", "pipeline": "functional", "seed": 3}, None, run_dir
    )
    assert identity == {key: None for key in IDENTITY_KEYS} | {
        "variant": "mean", "pipeline": "functional", "seed": 3, "world_size": 1,
        "overrides_hash": "",
    }  # fmt: skip
    with pytest.raises(ValueError, match=r"^cannot tell its variant$"):
        read_identity({"seed": 3}, None, run_dir)


# ------------------------------------------------------------------ W&B


def api_run(run_id: str, config: dict, state: str = "finished"):
    """A real ``wandb.apis.public.Run`` from a GraphQL-shaped record (config as the server's
    ``{"key": {"value": ...}}`` JSON); only ``scan_history`` is replaced (it needs the network)."""
    from wandb.apis.public import Run

    attrs = {
        "id": f"id-{run_id}",
        "name": run_id,
        "displayName": "renamed-by-hand",  # the name says nothing: identity is the config's
        "state": state,
        "group": "g",
        "jobType": None,
        "config": json.dumps(
            {key: {"value": value, "desc": None} for key, value in config.items()}
        ),
        "summaryMetrics": "{}",
        "systemMetrics": "{}",
        "tags": [],
        "historyKeys": None,
    }
    run = Run(None, "me", "proj", run_id, attrs=attrs, lazy=False)
    rows = [{"_step": e, "epoch": e, "train/loss": 2.0 / e, "test/acc": 0.1 * e,
             "time/epoch_s": 1.0} for e in (1, 2)]  # fmt: skip
    run.scan_history = lambda keys=None, page_size=1000, min_step=0, max_step=None: iter(rows)
    return run


OLD_CONFIG = {  # a resolved config logged before the identity block
    "name": "table1", "seed": 7, "batch_size": 16, "device": "cpu",
    "balance": {"_target_": "grab_exp.balance.MeanBalance", "_partial_": True},
    "pipeline": {"_target_": "grab_exp.runner.pipeline.FunctionalPipeline"},
    "optimizer": {"_target_": "torch.optim.SGD", "lr": 0.001},
    "distributed": {"enabled": False, "simulate_workers": 0, "workers": None},
}  # fmt: skip


def test_wandb_runs_take_their_identity_from_the_config_block():
    block = {key: None for key in IDENTITY_KEYS} | {
        "experiment": "table1", "variant": "pair", "pipeline": "functional", "optimizer": "sgd",
        "row": "pair", "batch_size": 16, "world_size": 1, "seed": 42, "overrides_hash": "ab12cd34",
    }  # fmt: skip
    new = api_run("new", OLD_CONFIG | {"identity": block})  # targets say mean, seed 7
    assert read_identity({}, dict(new.config)) == block
    frame = runs_frame(read_api_runs([new]))
    assert frame[["variant", "pipeline", "seed"]].drop_duplicates().values.tolist() == [
        ["pair", "functional", 42]
    ]
    assert frame["run"].iloc[0] == "wandb:me/proj/new"


def test_old_wandb_runs_are_identified_from_their_config():
    old = api_run("old", OLD_CONFIG)
    assert read_identity({}, dict(old.config)) == {key: None for key in IDENTITY_KEYS} | {
        "experiment": "table1", "variant": "mean", "pipeline": "functional", "optimizer": "sgd",
        "batch_size": 16, "world_size": 1, "seed": 7,
    }  # fmt: skip
    nameless = api_run("nameless", {"seed": 1})
    with pytest.warns(ReportWarning, match="skipping W&B run wandb:me/proj/nameless: cannot tell"):
        frame = runs_frame(read_api_runs([old, nameless]))
    assert set(frame["run"]) == {"wandb:me/proj/old"}
    assert frame[["variant", "pipeline", "seed"]].iloc[0].tolist() == ["mean", "functional", 7]
