"""The report on runs that are not one experiment (refused, naming the settings), on tests
without spread (n/a), on short runs (no duplicate Figure 1 panel) and on small overheads (sign
and size as measured): the committed runs of ``results/``, copied and changed where a case
needs another experiment."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from grab_exp.report import build_table1, read_epoch_bench, read_runs, runs_frame, table1_paired
from grab_exp.report.cli import main
from grab_exp.report.table1_figures import figure1, figure2, overhead_label, panel_spans
from grab_exp.report.table1_stats import paired_test, paired_tests

REPO = Path(__file__).resolve().parents[2]
RESULTS = REPO / "results"
LONG, SHORT = RESULTS / "table1" / "runs", RESULTS / "table1-5-epochs" / "runs"
BENCH = RESULTS / "bench" / "epoch_1t.json"
pytestmark = pytest.mark.skipif(not LONG.is_dir(), reason="no committed results/table1/runs")


def copy_rows(source: Path, out: Path, rows=("rr", "mean")) -> Path:
    for row in rows:
        shutil.copytree(source / row, out / row)
    return out


def another_run(run: Path, out: Path, seed: int, **config) -> Path:
    """A copy of ``run`` as a run of ``seed`` whose recorded config has ``config`` set."""
    shutil.copytree(run, out)
    summary = json.loads((out / "summary.json").read_text())
    summary["identity"]["seed"] = summary["seed"] = seed
    summary["config_fingerprint"]["config"] |= {"seed": seed, **config}
    (out / "summary.json").write_text(json.dumps(summary))
    return out


def refusal(capsys, *paths: Path, out: Path) -> str:
    assert main(["table1", *map(str, paths), "--out", str(out), "--no-paper"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and not out.exists()  # one line, before anything is written
    return err


def test_a_folder_of_two_experiments_is_refused_naming_the_settings(tmp_path, capsys):
    sweep = copy_rows(LONG, tmp_path / "sweep")
    another_run(
        LONG / "mean" / "seed0", tmp_path / "mine" / "seed1",
        seed=1, **{"model._target_": "grab_exp.models.MLP", "loss.gamma": 2.0},
    )  # fmt: skip
    err = refusal(capsys, tmp_path, out=tmp_path / "report")
    assert err.startswith("error: the runs are not one experiment: they differ beyond variant ")
    assert f"model._target_ ('grab_exp.models.MLP' in {tmp_path / 'mine' / 'seed1'}, " in err
    assert f"'grab_exp.models.LeNet' in {sweep / 'mean' / 'seed0'})" in err
    assert "loss.gamma" not in err  # only one run has it: a key of newer code, not a setting
    assert "pass only its sweep's or runs' folders" in err
    assert main(["table1", str(sweep), "--out", str(tmp_path / "one"), "--no-paper"]) == 0


def test_runs_of_two_commits_and_lengths_are_refused(tmp_path, capsys):
    err = refusal(capsys, LONG / "mean", SHORT / "mean", out=tmp_path / "report")
    assert "overrides_hash ('' in " in err and "'49b0123a' in " in err


def test_an_orderings_own_setting_may_differ_between_orderings_not_within_one(tmp_path, capsys):
    runs = copy_rows(LONG, tmp_path / "runs", rows=("rr", "mean", "recursive"))
    frame = runs_frame(read_runs([runs]))  # balance.depth: recursive's alone, balance.* differ
    assert frame["variant"].nunique() == 3
    another_run(LONG / "mean" / "seed0", runs / "mean" / "seed1", seed=1, **{"balance.c": 10.0})
    err = refusal(capsys, runs, out=tmp_path / "report")
    assert "balance.c (30.0 in " in err and f"10.0 in {runs / 'mean' / 'seed1'}" in err


def test_two_runs_of_one_variant_and_seed_are_refused_naming_both(tmp_path, capsys):
    copy_rows(LONG, tmp_path / "a", rows=("mean",))
    shutil.copytree(LONG / "mean" / "seed7", tmp_path / "b" / "seed7")
    err = refusal(capsys, tmp_path / "a", tmp_path / "b", out=tmp_path / "report")
    assert err == (
        f"error: two runs of mean/functional seed 7 with the same settings: "
        f"{tmp_path / 'a' / 'mean' / 'seed7'} and {tmp_path / 'b' / 'seed7'}; pass only one of them"
    )


def test_a_difference_without_spread_has_no_p_value():
    test = paired_test([0.3, 0.5, 0.7], [0.1, 0.3, 0.5], 1)
    assert math.isnan(test.t) and math.isnan(test.p)  # was t 1.25e16, p 6e-33
    assert test.mean == pytest.approx(0.2) and test.better == 3
    spread = paired_test([0.3, 0.5, 0.7], [0.1, 0.3, 0.49], 1)  # a real, small spread
    t = (0.61 / 3) / (math.sqrt(1e-4 / 3) / math.sqrt(3))  # differences 0.2, 0.2, 0.21
    assert spread.t == pytest.approx(t) and spread.p == pytest.approx(1 - t / math.sqrt(2 + t * t))


def test_the_tests_table_says_n_a_where_a_test_has_no_p(tmp_path):
    runs = copy_rows(SHORT, tmp_path / "runs", rows=("rr-classic", "rr", "mean"))
    frame = runs_frame(read_runs([runs]))
    tests = paired_tests(frame, early_epoch=5)
    text = table1_paired.tests_markdown(tests)
    assert "n/a: no p-value" in text and "—" not in text
    assert "| n/a |" not in text  # these runs all have spread
    same = frame[frame["pipeline"] != "classic"].copy()  # mean := rr + 0.1: no spread
    rr = same[same["variant"] == "rr"].set_index(["seed", "epoch"])["test/acc"]
    mean = same["variant"] == "mean"
    keys = list(zip(same.loc[mean, "seed"], same.loc[mean, "epoch"], strict=True))
    same.loc[mean, "test/acc"] = [rr[key] + 0.1 for key in keys]
    text = table1_paired.tests_markdown(paired_tests(same, early_epoch=5))
    row = "| test accuracy | Mean minus RR (functional) | +0.1000 | n/a | n/a | 2 | n/a | n/a |"
    assert row in text  # no interval, no t, no p, no Holm p


def test_a_short_run_draws_each_panel_once(tmp_path):
    frame = runs_frame(read_runs([copy_rows(SHORT, tmp_path / "runs")]))
    for last, spans in ((1, [(1, 1)]), (2, [(1, 2)]), (3, [(1, 3), (1, 2)])):
        assert panel_spans(last, max(2, math.ceil(last / 2))) == spans
        titles = [ax.get_title() for ax in figure1(frame[frame["epoch"] <= last]).axes]
        assert len(titles) == len(set(titles)) == 2 * len(spans), titles


def test_figure_1_starts_at_the_first_epoch():
    figure = figure1(runs_frame(read_runs([LONG])))
    for ax in figure.axes:
        assert ax.get_xlim()[0] >= 1 and min(ax.get_xticks()) >= 1, ax.get_title()
    assert [ax.get_xticks()[0] for ax in figure.axes[:2]] == [1, 1]


@pytest.mark.parametrize(
    ("pct", "label"),
    [(-0.4, "-0.4%"), (0.4, "+0.4%"), (0.03, "+0.03%"), (0.0, "0%"), (12.3, "+12%"), (-35, "-35%")],
)
def test_an_overhead_label_keeps_its_sign_and_size(pct, label):
    assert overhead_label(pct) == label


def test_figure_2_names_its_memory_and_its_sources_and_the_runs_path(tmp_path):
    frame = runs_frame(read_runs([SHORT]))
    table = build_table1(frame, bench=read_epoch_bench(BENCH, method="hooks"))
    title = figure2(table)._suptitle.get_text()
    assert title.startswith("Training time and peak RSS; ")
    assert "epoch_1t.json, its @hooks rows (commit 46a5cfc, 1 thread" in title
    bench = json.loads(BENCH.read_text())["rows"]
    hooks = {r["row"]: r["epoch_s"] for r in bench if r["row"].endswith("@hooks")}
    data = table.data
    rows = zip(data["variant"], data["pipeline"], data["bench_epoch_s"], strict=True)
    seconds = {(variant, pipeline): s for variant, pipeline, s in rows}
    assert seconds["mean", "functional"] == hooks["mean@hooks"]
    assert seconds["rr", "functional"] == hooks["rr@hooks"]
    assert seconds["rr", "classic"] == next(r["epoch_s"] for r in bench if r["row"] == "rr-classic")
    labels = [t.get_text() for t in figure2(table).axes[1].texts]
    assert any(" ± " in label and " MB, +0.4%" in label for label in labels), labels
    with pytest.raises(ValueError, match=r"no rows .*@nope"):
        read_epoch_bench(BENCH, method="nope")


def test_a_paired_test_gives_the_95_percent_t_interval():
    """For 2 degrees of freedom Student's t quantile has a closed form: (2u - 1) / sqrt(2u(1-u))."""
    test = paired_test([1.0, 2.0, 3.0], [0.0, 0.5, 0.5], 1)  # differences 1, 1.5, 2.5
    quantile = 0.95 / math.sqrt(2 * 0.975 * 0.025)
    half = quantile * test.sd / math.sqrt(3)
    assert (test.ci_low, test.ci_high) == pytest.approx((test.mean - half, test.mean + half))
    assert test.sd == pytest.approx(
        math.sqrt(((1 - 5 / 3) ** 2 + (1.5 - 5 / 3) ** 2 + (2.5 - 5 / 3) ** 2) / 2)
    )
    none = paired_test([0.3, 0.5, 0.7], [0.1, 0.3, 0.5], 1)
    assert math.isnan(none.ci_low) and math.isnan(none.ci_high)
