"""The ``vrgd_large_batch`` preset: arms, square-root lr rule, sweep, and its report."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from support.grab_run import cifar10_in_place, compose_config, grab_env, run_grab

from grab_exp.bench.vrgd import main as bench_main
from grab_exp.report.cli import main as report_cli
from grab_exp.report.vrgd import add_bench_times, per_run, summarize, time_to_target
from grab_exp.runner.config.check import validate_config
from grab_exp.runner.rundir.resolvers import settings_hash, sqrt_batch_lr

ARMS = {  # arm -> (optimizer option, pipeline, family whose base lr it shares)
    "sgd_momentum": ("sgd", "classic", "momentum"),
    "vr_momentum": ("vr_momentum", "functional", "momentum"),
    "adam": ("adam", "classic", "adam"),
    "vr_adam": ("vr_adam", "functional", "adam"),
}
BATCHES = [256, 1024, 4096]


def report_main(args: list[str]) -> int:
    """``python -m grab_exp.report vrgd ARGS`` in process."""
    return report_cli(["vrgd", *args])


def test_sqrt_batch_lr_is_the_square_root_rule():
    assert sqrt_batch_lr(0.02, 256, 256) == pytest.approx(0.02)
    assert sqrt_batch_lr(0.02, 256, 1024) == pytest.approx(0.04)
    assert sqrt_batch_lr(0.001, 256, 4096) == pytest.approx(0.004)
    with pytest.raises(ValueError, match="base_lr > 0"):
        sqrt_batch_lr(0.0, 256, 1024)


def test_settings_hash_leaves_out_the_keys_a_preset_puts_in_the_path():
    overrides = ["arm=vr_adam", "batch_size=1024", "seed=7"]
    assert settings_hash(overrides, ["arm", "batch_size"]) == ""
    assert settings_hash(overrides) != ""  # without the preset's path keys they are hashed
    assert settings_hash([*overrides, "epochs=2"], ["arm", "batch_size"]).startswith("-")


def sweep() -> dict[str, list[str]]:
    params = compose_config(["experiment=vrgd_large_batch"], hydra=True).hydra.sweeper.params
    parsed = OverridesParser.create().parse_overrides([f"{k}={v}" for k, v in params.items()])
    return {o.get_key_element(): list(o.sweep_string_iterator()) for o in parsed}


def test_the_sweep_is_four_arms_by_three_batches_by_three_seeds():
    assert sweep() == {
        "arm": list(ARMS),
        "batch_size": [str(b) for b in BATCHES],
        "seed": ["0", "7", "42"],
    }


@pytest.mark.parametrize("batch", BATCHES)
@pytest.mark.parametrize("arm", list(ARMS))
def test_each_arm_scales_its_family_lr_by_sqrt_batch(arm, batch, tmp_path):
    cfg = compose_config(["experiment=vrgd_large_batch", f"arm={arm}", f"batch_size={batch}"])
    optimizer, pipeline, family = ARMS[arm]
    choices = compose_config(
        ["experiment=vrgd_large_batch", f"arm={arm}"], hydra=True
    ).hydra.runtime.choices
    assert (choices.optimizer, choices.pipeline, choices.balance) == (optimizer, pipeline, "rr")
    assert (choices.model, choices.dataset) == ("lenet", "cifar10")
    base = {"momentum": 0.02, "adam": 0.001}[family]
    assert cfg.lr_rule.base_lr == base and cfg.lr_rule.base_batch_size == 256
    assert cfg.optimizer.lr == pytest.approx(base * math.sqrt(batch / 256))
    cifar10_in_place(cfg, tmp_path)  # no download: validation checks the rest
    validate_config(cfg)


@pytest.mark.parametrize(("vr", "plain"), [("vr_momentum", "sgd_momentum"), ("vr_adam", "adam")])
def test_vr_arms_share_every_setting_of_their_plain_arm(vr, plain):
    nodes = [compose_config(["experiment=vrgd_large_batch", f"arm={a}"]) for a in (vr, plain)]
    vr_opt, plain_opt = (n.optimizer for n in nodes)
    shared = set(plain_opt) - {"_target_"}
    for key in shared - {"eps"}:  # Adam's eps is VRAdam's adam_eps
        assert vr_opt[key] == plain_opt[key], key
    assert nodes[0].lr_rule == nodes[1].lr_rule


# ---------------------------------------------------------------- the report


def test_time_to_target_is_the_first_epoch_that_reaches_it():
    run = pd.DataFrame(
        {"epoch": [1, 2, 3], "test/acc": [0.2, 0.41, 0.39], "train_time_s": [5.0, 11.0, 18.0]}
    )
    assert time_to_target(run, 0.4) == (2.0, 11.0)
    assert time_to_target(run, 0.2) == (1.0, 5.0)
    assert all(math.isnan(v) for v in time_to_target(run, 0.5))


def test_summary_counts_the_seeds_that_reach_a_target():
    rows = []
    for seed, accs in [(0, [0.3, 0.5]), (1, [0.2, 0.3])]:
        for epoch, acc in enumerate(accs, 1):
            rows.append({"arm": "adam", "batch_size": 256, "seed": seed, "lr": 0.001,
                         "epoch": epoch, "test/acc": acc, "train/loss": 1.0,
                         "time/epoch_s": 2.0, "train_time_s": 2.0 * epoch})  # fmt: skip
    runs = per_run(pd.DataFrame(rows), [0.4])
    table = summarize(runs, [0.4])
    assert table.loc[0, "reached_0.4"] == 1 and table.loc[0, "time_to_0.4_s_mean"] == 4.0
    assert table.loc[0, "final_test_acc_mean"] == pytest.approx(0.4)


@pytest.mark.slow
def test_a_real_multirun_of_two_arms_gives_the_table_and_figure(tmp_path):
    """Real jobs (synthetic data, 2 epochs) through Hydra, then the report on their files."""
    args = ["-m", "experiment=vrgd_large_batch", "arm=sgd_momentum,vr_momentum", "seed=0",
            "batch_size=128", "epochs=2", "dataset=synthetic", "progress=none"]  # fmt: skip
    done = run_grab(args, tmp_path, grab_env(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:]
    sweep_dir = tmp_path / "outputs" / "vrgd_large_batch"
    runs = sorted(p.parent.relative_to(sweep_dir) for p in sweep_dir.rglob("summary.json"))
    assert [p.parts[:2] for p in runs] == [
        ("sgd_momentum", "batch128"),
        ("vr_momentum", "batch128"),
    ]
    out, archive = tmp_path / "report", tmp_path / "archive"
    assert report_main([str(sweep_dir), "--out", str(out), "--archive", str(archive),
                        "--targets", "0.2"]) == 0  # fmt: skip
    table = pd.read_csv(out / "vrgd_table.csv")
    assert list(table["arm"]) == ["sgd_momentum", "vr_momentum"]
    assert list(table["lr"]) == pytest.approx([0.02 * math.sqrt(0.5)] * 2)
    per_seed = pd.read_csv(out / "vrgd_runs.csv")
    for run_dir, row in zip(runs, per_seed.itertuples(), strict=True):
        metrics = pd.read_csv(sweep_dir / run_dir / "metrics.csv")
        assert row.final_test_acc == metrics["test/acc"].iloc[-1]
        assert row.epoch_s == metrics["time/epoch_s"].median()
    assert (out / "vrgd_figure.png").stat().st_size > 10_000
    assert "| 128 | VR-Momentum |" in (out / "vrgd_table.md").read_text()
    # the archive holds every run's light files, and the report reads it back identically
    assert report_main([str(archive), "--out", str(tmp_path / "again"), "--targets", "0.2"]) == 0
    assert (tmp_path / "again" / "vrgd_table.csv").read_text() == table.to_csv(index=False)


def test_the_bench_times_every_arm_and_the_report_uses_its_epoch_times(tmp_path):
    bench_json = tmp_path / "vrgd.json"
    bench = bench_main(["--batches", "8,16", "--repeats", "2", "--warmup", "1", "--steps", "1",
                        "--device", "cpu", "--out", str(bench_json)])  # fmt: skip
    rows = pd.DataFrame(bench["rows"])
    assert list(zip(rows["batch_size"], rows["arm"], strict=True)) == [
        (b, a) for b in (8, 16) for a in ARMS
    ]
    assert (rows["epoch_s"] == rows["step_ms"] / 1e3 * (-(-50_000 // rows["batch_size"]))).all()
    assert rows["gsnr_ms"].isna().tolist() == [a not in ("vr_momentum", "vr_adam") for a in
                                                 rows["arm"]]  # fmt: skip
    # the report: idle-machine time to target = mean epochs to target x the bench's epoch time
    frame = pd.DataFrame(
        [{"arm": arm, "batch_size": 16, "seed": 0, "lr": 0.1, "epoch": e, "test/acc": acc,
          "train/loss": 1.0, "time/epoch_s": 9.0, "train_time_s": 9.0 * e}
         for arm in ARMS for e, acc in ((1, 0.1), (2, 0.5))]
    )  # fmt: skip
    table = add_bench_times(summarize(per_run(frame, [0.4]), [0.4]), bench, [0.4])
    epoch_s = rows[rows["batch_size"] == 16].set_index("arm")["epoch_s"]
    for row in table.itertuples():
        assert row.bench_epoch_s == epoch_s[row.arm]
    assert table["bench_time_to_0.4_s"].tolist() == (2 * table["bench_epoch_s"]).tolist()
