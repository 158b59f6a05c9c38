#!/usr/bin/env python
"""Recompute, from the committed raw runs and bench files, every number that ``README.md``,
``results/README.md``, ``results/vrgd/README.md``, ``results/distributed/README.md`` and
``results/bench/README.md`` quote.

Run from the repository root: ``python scripts/results_numbers.py`` writes them to
``results/numbers.md`` (the one home of every number the READMEs and ``docs/`` quote; ``--check``
only says whether that file and the pages' quotes are current, ``--bench DIR --out -`` prints
another folder's bench files). A page quotes a number as ``<!--n:label-->value<!--/n-->``; the
script rewrites each quoted value in ``README.md``, ``docs/*.md`` and ``results/**/README.md``
from numbers.md, so a number lives in one place and the prose cannot go stale.
Comparisons of two arms are paired by seed; Table 1's paired tests are the report's
(``table1_tests.csv``, quoted here), VRGD's use the same :func:`paired_test` (SciPy). Every
bench number is one line ``label = value``: the label names the file (without ``.json``), the
row and the quantity, e.g. ``epoch_1t.mean.ratio = 1.68``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import json
import math
import re
import statistics
import sys
from pathlib import Path

import pandas as pd

from grab_exp.report.table1_rows import GRAB_ROWS, ROW_KEYS, row_label
from grab_exp.report.table1_stats import FAMILY_PAIRS, FAMILY_VS_RR, FAMILY_VS_RR_EARLY, paired_test
from grab_exp.runner.rundir.resolvers import variant_dir

RESULTS = Path("results")
#: Table 1's rows as the run directories and bench files name them (``rr-classic``: the plain
#: loop; ``rr``: per-sample), from conf/ through the report package, and its GraB rows
TABLE1_ROWS = list(ROW_KEYS)
GRAB = [variant_dir(*row) for row in GRAB_ROWS]
GRAB_LABELS = [row_label(*row) for row in GRAB_ROWS]
#: the bench files of one sitting (``results/bench/README.md`` has their commands)
BENCH_FILES = ["epoch_1t", "epoch_2t", "orderings", "projection", "rss", "conv", "vrgd", "sweep"]
MIB = 2**20
#: issue 21's targets for a row's step time over the classic step (``ratio_to_classic_rr``)
TARGETS = {
    "rr": 1.2,
    "mean": 1.4,
    "pair": 1.4,
    "batch": 1.4,
    "recursive_pair": 1.8,
    "recursive": 2.5,
}


#: the overheads the paper's text states (they are not in its Table 1): its abstract's headline,
#: "only in the cost of 8.7% training time overhead and 0.85% peak GPU memory usage overhead",
#: and its Figure 2 text's ranges for mean, pair and batch balance and for the recursive two
PAPER_TEXT = {
    "headline.time_overhead_pct": "+8.7",
    "headline.mem_overhead_pct": "+0.85",
    "simple.time_overhead_pct": "8.7-22",
    "simple.mem_overhead_pct": "0.85-12",
    "recursive.time_overhead_pct": "60-90",
    "recursive.mem_overhead_pct": "53-66",
}


def variance_ratio_p(f: float) -> float:
    """Two-sided p of a variance ratio F with (2, 2) degrees of freedom (CDF x / (1 + x))."""
    return 2 * min(f / (1 + f), 1 / (1 + f))


def show(label: str, value: object) -> None:
    """One quotable number: ``label = value``."""
    print(f"{label} = {value}")


def span(values, digits: int) -> str:
    """``low-high`` of ``values`` at ``digits`` decimals (one value when they round alike)."""
    low, high = f"{min(values):.{digits}f}", f"{max(values):.{digits}f}"
    return low if low == high else f"{low}-{high}"


def signed_span(values, digits: int) -> str:
    """``low to high`` of ``values``, signed, at ``digits`` decimals."""
    return f"{min(values):+.{digits}f} to {max(values):+.{digits}f}"


def mb(size: float) -> str:
    """Bytes in decimal units, 3 significant digits: ``21.3 MB``, ``803 kB``."""
    return f"{size / 1e6:.3g} MB" if size >= 1e6 else f"{size / 1e3:.3g} kB"


def mib(size: float) -> str:
    """Bytes in MiB (2^20), as ``857 MiB`` (``1.08 MiB`` below 10)."""
    return f"{size / MIB:,.2f} MiB" if size < 10 * MIB else f"{size / MIB:,.0f} MiB"


def table1(folder: str, label: str) -> None:
    """Table 1's numbers, labels under ``label``: ``folder``'s ``runs.csv`` (5-epoch runs in
    ``table1-5-epochs``, 100-epoch runs in ``table1``) and the report's paired differences and
    tests there (``table1_paired.csv``, ``table1_tests.csv``: quoted, not recomputed)."""
    runs = pd.read_csv(RESULTS / folder / "runs.csv")
    runs["row"] = [
        variant_dir(v, p) for v, p in zip(runs["variant"], runs["pipeline"], strict=True)
    ]
    final = runs["epoch"].max()
    print(f"[{label}] {len(runs['run'].unique())} runs, final epoch {final}")
    show(f"{label}.runs", len(runs["run"].unique()))
    first_epoch(runs, label)
    classic_equals_rr(runs, label)
    last = runs[runs["epoch"] == final].pivot(index="seed", columns="row")
    table(last, label)
    print(
        "rank of each GraB row per seed (1 = best), loss\n", last["train/loss"][GRAB].rank(axis=1)
    )
    print("rank per seed, accuracy\n", last["test/acc"][GRAB].rank(axis=1, ascending=False))
    paired = pd.read_csv(RESULTS / folder / "table1_paired.csv")
    per_seed(paired, final, label)
    show(f"{label}.rr.acc_points_per_seed", (100 * last["test/acc"]["rr"]).round(2).tolist())
    tests = pd.read_csv(RESULTS / folder / "table1_tests.csv")
    versus_rr_tests(tests, label)
    pair_tests(tests, label)
    paper_gaps(last, final, label)
    run_times(sorted(runs["run"].unique()), label)
    overheads(folder, label)
    if final <= 10:
        rss_increments_by_seed(runs, label)
    if final > 10:
        memory(folder, label)
        per_seed(paired, 5, f"{label}.ep5")
        last_epochs(runs, label)
        window_sensitivity(runs, label)
        running_loss_vs_paper(last, label)
        early(runs, label)
        rerun(runs, label)
        wall_times(sorted(runs["run"].unique()), label)


def per_seed(paired: pd.DataFrame, epoch: int, label: str) -> None:
    """From the report's ``table1_paired.csv``: each GraB row minus RR (functional) of the same
    seed at ``epoch``: the span over rows and seeds, per seed and per row; and the span of the
    rows' mean differences, full-pass loss and running loss."""
    part = paired[(paired["epoch"] == epoch) & paired["row"].isin(GRAB_LABELS)]
    loss, acc = (part[part["metric"] == m] for m in ("train/loss", "test/acc"))
    show(f"{label}.grab_minus_rr.loss", signed_span(loss["difference"], 3))
    show(f"{label}.grab_minus_rr.acc_points", signed_span(100 * acc["difference"], 1))
    for seed, values in acc.groupby("seed"):
        show(
            f"{label}.grab_minus_rr.acc_points.seed{seed}",
            signed_span(100 * values["difference"], 1),
        )
    for (variant, pipeline), values in acc.groupby(["variant", "pipeline"], sort=False):
        key = variant_dir(variant, pipeline)
        show(f"{label}.{key}_minus_rr.acc_points", signed_span(100 * values["difference"], 1))
    for metric in ("train/loss", "train/running_loss"):
        means = part[part["metric"] == metric].groupby("row")["difference"].mean()
        if len(means):
            name = metric.split("/")[1]
            show(f"{label}.grab_minus_rr.{name}.row_means", signed_span(means, 3))


#: late windows of the sensitivity check: each run's mean over its last k epochs
SENSITIVITY_WINDOWS = (1, 2, 3, 5, 10, 20, 30, 50)


#: every window from the last SENSITIVITY_SPAN[0] to the last SENSITIVITY_SPAN[1] epochs is
#: checked too, so that the page's "every window from the last 3 to the last 50" is a count
SENSITIVITY_SPAN = (3, 50)


def window_sensitivity(runs: pd.DataFrame, label: str) -> None:
    """How many of the 10 GraB-vs-RR paired t-tests (5 variants, train loss and test accuracy,
    uncorrected) give p < 0.05 on each run's mean over its last k epochs, per k of
    :data:`SENSITIVITY_WINDOWS`, and the fewest over every k of :data:`SENSITIVITY_SPAN`; the
    91-100 window was chosen after seeing RR's last epoch."""
    final = runs["epoch"].max()

    def below_05(k: int) -> tuple[int, int]:
        means = runs[runs["epoch"] > final - k].groupby(["seed", "row"])[["train/loss", "test/acc"]]
        wide = means.mean().unstack()
        below = [
            paired_test(wide[column][row], wide[column]["rr"], 1).p < 0.05
            for column in ("train/loss", "test/acc")
            for row in GRAB
        ]
        return sum(below), len(below)

    counts = {}
    for k in SENSITIVITY_WINDOWS:
        counts[k] = "{} of {}".format(*below_05(k))
        show(f"{label}.window_sensitivity.last{k}.below_05", counts[k])
    show(f"{label}.window_sensitivity", "; ".join(f"last {k}: {c}" for k, c in counts.items()))
    first, last = SENSITIVITY_SPAN
    span = [below_05(k) for k in range(first, min(last, final) + 1)]
    fewest = min(span)
    show(
        f"{label}.window_sensitivity.every_last{first}_to_{last}",
        f"at least {fewest[0]} of {fewest[1]} in each of the {len(span)} windows",
    )


def running_loss_vs_paper(last: pd.DataFrame, label: str) -> None:
    """The other reading of the paper's train loss: our running loss (``train/running_loss``,
    the mean of the last epoch's step losses) minus the paper's final train loss, seed means per
    row; and the paper's own GraB rows minus its RR (functional) row, beside ours."""
    paper = pd.read_csv(RESULTS / "paper_table1.csv")
    keys = [variant_dir(v, p) for v, p in zip(paper["variant"], paper["pipeline"], strict=True)]
    published = paper.set_axis(keys)["train_loss_final"]
    running = last["train/running_loss"].mean().loc[keys]
    show(f"{label}.ours_running_minus_paper.loss", signed_span(running - published, 3))
    show("paper.grab_minus_rr.loss", signed_span(published[GRAB] - published["rr"], 3))


def overheads(folder: str, label: str) -> None:
    """From the report's ``table1.csv``: each row's time overhead over RR (functional) (from the
    bench it was given) and, for per-run memory, its increment ± standard error over seeds."""
    table = pd.read_csv(RESULTS / folder / "table1.csv")
    for row in table.itertuples():
        key = variant_dir(row.variant, row.pipeline)
        show(f"{label}.{key}.time_overhead_pct", f"{row.time_overhead_pct:+.0f}")
        if not pd.isna(row.mem_increment_se_mb):
            show(
                f"{label}.{key}.mem_increment",
                f"{row.mem_increment_mb:+.1f} ± {row.mem_increment_se_mb:.1f} MB",
            )
    grab = table[table["variant"].isin([v for v, _ in GRAB_ROWS])]
    show(f"{label}.grab.time_overhead_pct", signed_span(grab["time_overhead_pct"], 0))
    per_run = grab[grab["mem_increment_se_mb"].notna()]
    if len(per_run):
        multiples = per_run["mem_increment_mb"] / per_run["mem_increment_se_mb"]
        show(
            f"{label}.grab.mem_increment.se_multiples",
            f"{multiples.min():.1f} to {multiples.max():.1f}",
        )


def rss_increments_by_seed(runs: pd.DataFrame, label: str) -> None:
    """Per-run memory (peak RSS) paired by seed: each GraB row minus RR (functional) of the
    same seed at the final epoch, how many seeds are above 0 per row (the table's ± is the
    unpaired standard error of the difference of the seed means)."""
    final = runs[runs["epoch"] == runs["epoch"].max()]
    rss = final.pivot(index="seed", columns="row", values="mem/peak_rss_mb")
    if rss.isna().all().all():
        return
    parts = []
    for row, names in zip(GRAB, GRAB_ROWS, strict=True):
        difference = rss[row] - rss["rr"]
        parts.append(f"{row_label(*names)} {int((difference > 0).sum())} of {len(difference)}")
    show(f"{label}.grab.mem_increment.seeds_above", ", ".join(parts))


def memory(folder: str, label: str) -> None:
    """From the report's ``table1_vs_paper.csv``: each row's memory (ours: the training state),
    its increment over RR (functional) in MB and in %, ours and the paper's; the spans of mean,
    pair and batch balance (the paper's text's "simple" rows)."""
    side = pd.read_csv(RESULTS / folder / "table1_vs_paper.csv")
    simple = side[side["variant"].isin(["mean", "pair", "batch"])]
    for column in ("time_overhead_pct", "mem_overhead_pct"):
        show(f"{label}.simple.{column}", signed_span(simple[column], 0))
    show(f"{label}.simple.mem_increment_mb", signed_span(simple["mem_increment_mb"], 2))
    for row in side.itertuples():
        key = variant_dir(row.variant, row.pipeline)
        show(f"{label}.{key}.state_mb", f"{row.state_mb_mean:.2f}")
        show(f"paper.{key}.peak_gpu_mem_mb", f"{row.state_mb_paper:.2f}")
        for who, suffix in ((label, ""), ("paper", "_paper")):
            show(
                f"{who}.{key}.mem_increment_mb", f"{getattr(row, 'mem_increment_mb' + suffix):+.2f}"
            )
            show(
                f"{who}.{key}.mem_overhead_pct", f"{getattr(row, 'mem_overhead_pct' + suffix):+.0f}"
            )


#: the windows of table1_tests.csv, by how labels name them
WINDOWS = {"final": lambda w: "(mean)" not in w, "last10": lambda w: "(mean)" in w}
#: the metrics of table1_tests.csv, by how labels name them: (column, scale, decimals)
TESTED = {"loss": ("train/loss", 1, 3), "acc_points": ("test/acc", 100, 1)}


def p_value(p: float) -> str:
    """A p-value: 3 decimals, 4 below 0.001."""
    return f"{p:.4f}" if p < 0.001 else f"{p:.3f}"


def p_span(values) -> str:
    """``low-high`` of p-values (one when they print alike)."""
    low, high = p_value(min(values)), p_value(max(values))
    return low if low == high else f"{low}-{high}"


def versus_rr_tests(tests: pd.DataFrame, label: str) -> None:
    """From the report's ``table1_tests.csv``: the seeds and degrees of freedom; per family,
    window and metric, the GraB rows' mean differences from RR, their paired-t and Holm p, the
    seeds on the better side; how many tests of each family Holm keeps below 0.05."""
    seeds = sorted(set(tests["n"]))
    show(f"{label}.tests.seeds", "/".join(map(str, seeds)))
    show(f"{label}.tests.df", "/".join(str(n - 1) for n in seeds))
    show(f"{label}.tests.signed_rank_floor", ", ".join(f"{2 / 2**n:.2f}" for n in seeds))
    for family, name in ((FAMILY_VS_RR, "vs_rr"), (FAMILY_VS_RR_EARLY, "vs_rr_early")):
        part = tests[tests["family"] == family]
        if part.empty:
            continue
        show(f"{label}.{name}.tests", len(part))
        show(
            f"{label}.{name}.holm_below_05", f"{int((part['p_holm'] < 0.05).sum())} of {len(part)}"
        )
        for window, chosen in WINDOWS.items():
            for metric, (column, scale, digits) in TESTED.items():
                rows = part[part["window"].map(chosen) & (part["metric"] == column)]
                if not rows.empty:
                    _tested(rows, f"{label}.{name}.{window}.{metric}", scale, digits)


def _tested(rows: pd.DataFrame, key: str, scale: float, digits: int) -> None:
    """One window and metric of a family: its rows' spans."""
    show(f"{key}.window", rows["window"].iloc[0])
    show(f"{key}.diff", signed_span(scale * rows["mean_difference"], digits))
    show(f"{key}.p", p_span(rows["p"]))
    show(f"{key}.p_holm", p_span(rows["p_holm"]))
    show(f"{key}.holm_below_05", f"{int((rows['p_holm'] < 0.05).sum())} of {len(rows)}")
    show(f"{key}.better", f"{span(rows['better'], 0)} of {span(rows['n'], 0)}")
    keys = dict(zip(GRAB_LABELS, GRAB, strict=True))
    for row in rows.itertuples():
        low, high = (scale * getattr(row, end) for end in ("ci95_low", "ci95_high"))
        mean = scale * row.mean_difference
        d = digits + 1
        show(
            f"{key}.ci95.{keys.get(row.row, row.row)}",
            f"{mean:+.{d}f} [{low:+.{d}f}, {high:+.{d}f}]",
        )
    excludes = ((rows["ci95_low"] > 0) | (rows["ci95_high"] < 0)).sum()
    show(f"{key}.ci95.excludes_zero", f"{int(excludes)} of {len(rows)}")


def pair_tests(tests: pd.DataFrame, label: str) -> None:
    """From ``table1_tests.csv``: the GraB rows against each other, per window: the tests, the
    comparisons whose sign is the same on every seed, the smallest p (uncorrected) and the
    smallest Holm p of the family."""
    part = tests[tests["family"] == FAMILY_PAIRS]
    show(f"{label}.pairs.tests", len(part))
    show(f"{label}.pairs.min_p_holm", p_value(part["p_holm"].min()))
    for window, chosen in WINDOWS.items():
        rows = part[part["window"].map(chosen)]
        if rows.empty:
            continue
        same = rows[(rows["better"] == 0) | (rows["better"] == rows["n"])]
        show(f"{label}.pairs.{window}.tests", len(rows))
        show(f"{label}.pairs.{window}.same_sign", f"{len(same)} of {len(rows)}")
        show(f"{label}.pairs.{window}.same_sign_list", "; ".join(map(_ahead, same.itertuples())))
        low = rows.loc[rows["p"].idxmin()]
        show(f"{label}.pairs.{window}.min_p", f"{p_value(low['p'])} ({_ahead(low)})")


def _ahead(test) -> str:
    """``Recursive above Batch (test accuracy)``: which row is ahead on a tested metric."""
    row, versus = (test.row, test.versus) if test.better > 0 else (test.versus, test.row)
    word, name = (
        ("below", "train loss") if test.metric == "train/loss" else ("above", "test accuracy")
    )
    return f"{row} {word} {versus} in {name}"


def table(last: pd.DataFrame, label: str) -> None:
    """Table 1's cells at the last epoch: each row's train loss and test accuracy, mean ± std
    (ddof 1) over the seeds, as ``table1.md`` writes them."""
    for row in TABLE1_ROWS:
        for column, name in (("train/loss", "train_loss"), ("test/acc", "test_acc")):
            values = last[column][row]
            show(f"{label}.{row}.{name}", f"{values.mean():.4f} ± {values.std(ddof=1):.4f}")


def classic_equals_rr(runs: pd.DataFrame, label: str) -> None:
    """Whether classic RR's metrics equal functional RR's, bit for bit, at every epoch and seed."""
    keys, columns = ["seed", "epoch"], ["train/loss", "train/acc", "test/loss", "test/acc"]
    rr = runs[runs["row"] == "rr"].set_index(keys)[columns].sort_index()
    classic = runs[runs["row"] == "rr-classic"].set_index(keys)[columns].sort_index()
    show(f"{label}.classic_equals_rr_every_epoch", bool((rr == classic).all().all()))


def run_times(run_dirs: list[str], label: str) -> None:
    """From the runs' ``summary.json``: the minutes from the first run's start (``updated_at`` -
    ``wall_time_s``) to the last one's end, the minutes with 1, 2, ... runs going at once (those
    that round to 0 left out), the commits and the torch versions."""
    minutes, summaries = jobs_at_once([Path(d) / "summary.json" for d in run_dirs])
    show(f"{label}.first_start_to_last_end_min", f"{sum(minutes.values()):.0f}")
    going = ", ".join(f"{k}: {v:.0f}" for k, v in minutes.items() if k and round(v))
    show(f"{label}.min_by_runs_at_once", going)
    show(f"{label}.commits", sorted({s["git_commit"][:7] for s in summaries}))
    show(f"{label}.torch", sorted({s["library_versions"]["torch"] for s in summaries}))


def jobs_at_once(paths: list[Path]) -> tuple[dict[int, float], list[dict]]:
    """Minutes during which 1, 2, ... of the runs (``summary.json`` at ``paths``) were going at
    once, between the first one's start and the last one's end, and the summaries."""
    summaries = [json.loads(path.read_text()) for path in paths]
    ends = [pd.Timestamp(s["updated_at"]) for s in summaries]
    starts = [
        end - pd.Timedelta(seconds=s["wall_time_s"]) for end, s in zip(ends, summaries, strict=True)
    ]
    events = sorted([(t, 1) for t in starts] + [(t, -1) for t in ends])
    minutes, going = {}, 0
    for (time, step), (after, _) in itertools.pairwise(events):
        going += step
        minutes[going] = minutes.get(going, 0.0) + (after - time).total_seconds() / 60
    return dict(sorted(minutes.items())), summaries


def first_epoch(runs: pd.DataFrame, label: str) -> None:
    """How many distinct values the 7 rows of a seed reach after epoch 1 (one shared random
    permutation), and how far classic RR's plain backward lands from the per-sample rows."""
    first = runs[runs["epoch"] == 1]
    print(
        "epoch 1: distinct values across the 7 rows, per seed\n",
        first.groupby("seed")[["train/loss", "test/acc"]].nunique(),
    )
    show(
        f"{label}.epoch1.rows_distinct_losses",
        int(first.groupby("seed")["train/loss"].nunique().max()),
    )
    per_sample = first[first["pipeline"] != "classic"].groupby("seed")["train/loss"]
    show(f"{label}.epoch1.per_sample_rows_distinct_losses", int(per_sample.nunique().max()))
    d_loss, _ = grab_minus_rr(first)
    show(f"{label}.epoch1.classic_minus_rr.max_abs_loss", f"{d_loss['rr-classic'].abs().max():.4f}")


def grab_minus_rr(runs: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Per seed (index) and row (columns): each row's train loss and test accuracy (points),
    averaged over the epochs of ``runs``, minus functional RR's of the same seed."""
    means = runs.groupby(["seed", "row"])[["train/loss", "test/acc"]].mean().unstack()
    loss, acc = means["train/loss"], 100 * means["test/acc"]
    return loss.sub(loss["rr"], axis=0), acc.sub(acc["rr"], axis=0)


def last_epochs(runs: pd.DataFrame, label: str) -> None:
    """How much each row's test accuracy moves from epoch to epoch over the last 10 epochs (the
    sample std over those epochs, per run, in points)."""
    final = runs["epoch"].max()
    chosen = runs[runs["epoch"] > final - 10]
    sd = 100 * chosen.groupby(["seed", "row"])["test/acc"].std().unstack()
    show(f"{label}.last10.acc_sd_points.rr", span(sd[["rr", "rr-classic"]].to_numpy().ravel(), 2))
    show(f"{label}.last10.acc_sd_points.grab", span(sd[GRAB].to_numpy().ravel(), 2))


def paper_gaps(last: pd.DataFrame, final: int, label: str) -> None:
    """Ours - the paper's columns at epoch ``final`` (5: its early columns; else its final ones),
    seed means, per row; for the 100-epoch runs also their spans and the report's headline gap:
    mean balance minus classic RR in test accuracy, ours per seed beside the paper's."""
    paper = pd.read_csv(RESULTS / "paper_table1.csv")
    keys = [variant_dir(v, p) for v, p in zip(paper["variant"], paper["pipeline"], strict=True)]
    paper = paper.set_axis(keys)
    column = "epoch5" if final == 5 else "final"
    ours = last[["train/loss", "test/acc"]].mean().unstack(level=0).loc[keys]
    gap_loss = ours["train/loss"] - paper[f"train_loss_{column}"]
    gap_acc = 100 * (ours["test/acc"] - paper[f"test_acc_{column}"])
    for key in keys:
        print(
            f"{key}: ours - paper at ep. {final}: "
            f"loss {gap_loss[key]:+.3f} acc {gap_acc[key]:+.2f} points"
        )
        show(f"{label}.{key}.minus_paper.loss", f"{gap_loss[key]:+.3f}")
        show(f"{label}.{key}.minus_paper.acc_points", f"{gap_acc[key]:+.2f}")
        if final <= 10:  # the paper's columns Table 1 sets beside ours
            show(
                f"paper.{key}.train_loss_{column}", f"{paper.loc[key, f'train_loss_{column}']:.4f}"
            )
            show(f"paper.{key}.test_acc_{column}", f"{paper.loc[key, f'test_acc_{column}']:.4f}")
    show(f"{label}.ours_minus_paper.grab.loss", signed_span(gap_loss[GRAB], 3))
    show(f"{label}.ours_minus_paper.rr.loss", signed_span(gap_loss[["rr", "rr-classic"]], 3))
    show(f"{label}.ours_minus_paper.grab.acc_points", signed_span(gap_acc[GRAB], 1))
    show(f"{label}.ours_minus_paper.acc_points", signed_span(gap_acc, 1))
    if final <= 10:
        return
    acc = 100 * last["test/acc"]
    headline = acc["mean"] - acc["rr-classic"]
    show(f"{label}.mean_minus_rr_classic.acc_points", f"{headline.mean():+.1f}")
    show(f"{label}.mean_minus_rr_classic.acc_points.per_seed", signed_span(headline, 1))
    published = 100 * (
        paper.loc["mean", "test_acc_final"] - paper.loc["rr-classic", "test_acc_final"]
    )
    show("paper.mean_minus_rr_classic.acc_points", f"{published:+.1f}")
    for key, value in PAPER_TEXT.items():
        show(f"paper.text.{key}", value)


def rerun(runs: pd.DataFrame, label: str) -> None:
    """The 100-epoch runs' first 5 epochs beside the 5-epoch runs of the same row and seed (two
    commits, same configs): the largest differences, at epoch 1 and over epochs 1-5."""
    short = pd.read_csv(RESULTS / "table1-5-epochs" / "runs.csv")
    keys = ["variant", "pipeline", "seed", "epoch"]
    both = short.merge(runs, on=keys, suffixes=("_5", "_100"))
    for name in ("train/loss", "test/acc"):
        diff = (both[f"{name}_5"] - both[f"{name}_100"]).abs()
        key = f"{label}.vs_5_epoch_runs.{name.replace('/', '_')}"
        show(f"{key}.max_epoch1", f"{diff[both['epoch'] == 1].max():.4f}")
        show(f"{key}.max", f"{diff.max():.4f}")


def wall_times(run_dirs: list[str], label: str) -> None:
    """The runs' own wall times (``summary.json``'s ``wall_time_s``) and machines."""
    summaries = [json.loads((Path(d) / "summary.json").read_text()) for d in run_dirs]
    hours = [s["wall_time_s"] / 3600 for s in summaries]
    show(f"{label}.wall_time.sum_h", f"{sum(hours):.1f}")
    show(f"{label}.wall_time.per_run_h", span(hours, 1))
    show(f"{label}.machines", sorted({s["machine"]["cpu"] for s in summaries}))


def early(runs: pd.DataFrame, label: str) -> None:
    """Whether a recursive row leads the GraB rows in epochs 2-10, on the seed means and on each
    seed, with the smallest margin on the means (the best recursive row against the best other
    one), and the spread of the five at the last epoch."""
    recursive = [row for row in GRAB if row.startswith("recursive")]
    others = [row for row in GRAB if row not in recursive]
    show(f"{label}.recursive_leads.chance", f"{len(recursive)} in {len(GRAB)}")
    epochs = list(range(2, 11))
    for name, column, sign, scale in (
        ("loss", "train/loss", -1, 1),
        ("acc", "test/acc", 1, 100),
    ):
        values = runs[runs["epoch"].isin(epochs)].pivot_table(
            index=["seed", "epoch"], columns="row", values=column
        )
        means = values.groupby(level="epoch").mean()
        best = (means[recursive] * sign).max(axis=1) - (means[others] * sign).max(axis=1)
        margin = scale * best  # > 0: a recursive row leads the others
        show(
            f"{label}.recursive_leads.{name}.seed_means",
            f"{int((margin > 0).sum())} of {len(epochs)}",
        )
        digits = 4 if name == "loss" else 2
        show(f"{label}.recursive_leads.{name}.min_margin", f"{margin[margin > 0].min():.{digits}f}")
        sd = scale * values[GRAB].groupby(level="epoch").std()  # over seeds, per epoch and row
        show(f"{label}.recursive_leads.{name}.seed_sd", span(sd.to_numpy().ravel(), digits - 1))
        for seed, part in values.groupby(level="seed"):
            ahead = (part[recursive] * sign).max(axis=1) > (part[others] * sign).max(axis=1)
            show(
                f"{label}.recursive_leads.{name}.seed{seed}", f"{int(ahead.sum())} of {len(epochs)}"
            )
    means = runs.groupby(["epoch", "row"])[["train/loss", "test/acc"]].mean()
    loss, acc = means["train/loss"].unstack()[GRAB], means["test/acc"].unstack()[GRAB]
    final = loss.index.max()
    show(f"{label}.grab_spread.loss", f"{loss.loc[final].max() - loss.loc[final].min():.4f}")
    spread = 100 * (acc.loc[final].max() - acc.loc[final].min())
    show(f"{label}.grab_spread.acc_points", f"{spread:.2f}")


def vrgd() -> None:
    runs = pd.read_csv(RESULTS / "vrgd" / "vrgd_runs.csv")
    show("vrgd_runs.runs", len(runs))
    acc = runs.pivot_table(index=["batch_size", "seed"], columns="arm", values="final_test_acc")
    gaps = []
    for vr, plain in (("vr_momentum", "sgd_momentum"), ("vr_adam", "adam")):
        for batch, part in acc.groupby(level=0):
            diff = 100 * (part[vr] - part[plain])
            p = paired_test(part[vr], part[plain], 1).p  # scipy.stats.ttest_rel
            print(
                f"{vr} - {plain} @ {batch}: per seed {diff.round(2).tolist()} "
                f"mean {diff.mean():+.2f} points, paired t p={p:.2f}"
            )
            key = f"vrgd_runs.{vr}_minus_{plain}.B{batch}"
            show(f"{key}.acc_points.per_seed", ", ".join(f"{d:+.2f}" for d in diff))
            show(f"{key}.acc_points", f"{diff.mean():+.2f}")
            show(f"{key}.p", f"{p:.2f}")
            gaps.append(diff)
    show("vrgd_runs.vr_minus_plain.max_acc_points", f"{max(d.max() for d in gaps):+.2f}")
    a = acc.loc[4096]
    va, vb = a["adam"].var(ddof=1), a["vr_adam"].var(ddof=1)
    f = va / vb
    p = variance_ratio_p(f)
    print(
        f"4096 final acc Adam {(100 * a['adam']).round(2).tolist()}, "
        f"VR-Adam {(100 * a['vr_adam']).round(2).tolist()}; F={f:.2f} two-sided p={p:.2f}"
    )
    show("vrgd_runs.B4096.adam_over_vr_adam.variance_ratio", f"{f:.2f}")
    show("vrgd_runs.B4096.adam_over_vr_adam.variance_ratio_p", f"{p:.2f}")
    vrgd_targets(runs)
    vrgd_table()
    print("steps per epoch:", {b: math.ceil(50_000 / b) for b in (256, 1024, 4096)})
    clips = []
    for path in sorted((RESULTS / "vrgd" / "runs").glob("vr_*/batch*/seed*/metrics.csv")):
        m = pd.read_csv(path)
        clips.append(m.assign(arm=path.parts[-4]))
    clips = pd.concat(clips)
    print("clip fractions per epoch, min / mean / max over every epoch and run:")
    print(
        clips.groupby("arm")[["gsnr/clip_low", "gsnr/clip_high"]]
        .agg(["min", "mean", "max"])
        .round(3)
    )
    for (arm, column), values in clips.melt("arm", ["gsnr/clip_low", "gsnr/clip_high"]).groupby(
        ["arm", "variable"]
    )["value"]:
        key = f"vrgd_runs.{arm}.{column.removeprefix('gsnr/')}_pct"
        show(key, span(100 * values, 0))
        show(f"{key}.mean", f"{100 * values.mean():.0f}")
    summaries = sorted((RESULTS / "vrgd" / "runs").glob("*/*/*/summary.json"))
    run_times([str(p.parent) for p in summaries], "vrgd_runs")
    cells = itertools.groupby(summaries, key=lambda p: p.parts[-4:-2])  # (arm, batch<B>), seeds
    for (arm, batch), paths in cells:
        seconds = [json.loads(p.read_text())["wall_time_s"] for p in paths]
        label = f"vrgd_runs.{arm}.B{batch.removeprefix('batch')}.wall_time"
        show(f"{label}.s", ", ".join(f"{t:.0f}" for t in sorted(seconds)))
        show(f"{label}.min", span([t / 60 for t in seconds], 1))


def vrgd_targets(runs: pd.DataFrame) -> None:
    """The epochs to 45% of each VR arm minus its plain arm's, per seed (the largest difference,
    batches 256 and 1024, where every seed reached it), and at batch 4096 the final accuracy of
    the seeds that did not reach 45% and the lowest momentum run."""
    epochs = runs.pivot_table(index=["batch_size", "seed"], columns="arm", values="epochs_to_0.45")
    both = epochs.loc[[256, 1024]]
    diff = pd.concat([both["vr_momentum"] - both["sgd_momentum"], both["vr_adam"] - both["adam"]])
    show("vrgd_runs.B256_B1024.epochs_to_45.vr_minus_plain.max_abs", f"{diff.abs().max():.0f}")
    large = runs[runs["batch_size"] == 4096]
    for arm, part in large.groupby("arm"):
        short = part[part["epochs_to_0.45"].isna()]["final_test_acc"]
        show(f"vrgd_runs.B4096.{arm}.reached_45", f"{len(part) - len(short)} of {len(part)}")
        if len(short):
            show(f"vrgd_runs.B4096.{arm}.not_reached_45.final_acc_pct", span(100 * short, 2))
            show(f"vrgd_runs.B4096.{arm}.not_reached_45.short_points", span(45 - 100 * short, 2))
        show(
            f"vrgd_runs.B4096.{arm}.lowest_final_acc_pct",
            f"{100 * part['final_test_acc'].min():.1f}",
        )


#: the columns of ``vrgd_table.csv`` the page quotes: label, column, format, scale
VRGD_COLUMNS = [
    ("final_acc_pct", "final_test_acc_mean", "{:.2f}", 100),
    ("final_acc_std_points", "final_test_acc_std", "{:.2f}", 100),
    ("epochs_to_45", "epochs_to_0.45_mean", "{:.1f}", 1),
    ("idle_time_to_45_s", "bench_time_to_0.45_s", "{:.0f}", 1),
]


def vrgd_table() -> None:
    """The cells of ``vrgd_table.csv`` (``vrgd_table.md``'s numbers) that the page quotes."""
    table = pd.read_csv(RESULTS / "vrgd" / "vrgd_table.csv")
    for r in table.to_dict("records"):
        for name, column, form, scale in VRGD_COLUMNS:
            if not pd.isna(r[column]):
                show(
                    f"vrgd_table.B{r['batch_size']}.{r['arm']}.{name}",
                    form.format(scale * r[column]),
                )


def distributed() -> None:
    """The 2-worker runs (``distributed/per_epoch.csv``): the table's cells (train loss at epochs
    1, 2, 5 and 10, test accuracy at 10, mean ± std over the seeds), CD-GraB's final train loss
    minus D-RR's and D-GraB's per seed, the epochs where its mean is below D-RR's, how many
    distinct train losses the orderings of a seed have after epoch 1; the runs' commits."""
    runs = pd.read_csv(RESULTS / "distributed" / "per_epoch.csv")
    final = runs["epoch"].max()
    cells = [("train/loss", "train_loss", e) for e in (1, 2, 5, final)]
    for variant, part in runs.groupby("variant"):
        for column, name, epoch in [*cells, ("test/acc", "test_acc", final)]:
            values = part[part["epoch"] == epoch][column]
            key = f"distributed.{variant}.{name}.ep{epoch}"
            show(key, f"{values.mean():.4f} ± {values.std(ddof=1):.4f}")
    loss = runs.pivot_table(index=["epoch", "seed"], columns="variant", values="train/loss")
    for other in ("d_rr", "d_grab"):
        diff = (loss["cd_grab"] - loss[other]).loc[final]
        show(
            f"distributed.cd_grab_minus_{other}.loss.per_seed", ", ".join(f"{d:+.3f}" for d in diff)
        )
    means = loss.groupby(level=0).mean()
    below = [int(e) for e in means.index if means.loc[e, "cd_grab"] < means.loc[e, "d_rr"]]
    show("distributed.cd_grab_below_d_rr.epochs", below)
    first = runs[runs["epoch"] == 1].groupby("seed")["train/loss"].nunique().max()
    show("distributed.epoch1.distinct_losses", int(first))
    paths = sorted((RESULTS / "distributed" / "runs").glob("*/*/summary.json"))
    summaries = [json.loads(path.read_text()) for path in paths]
    show("distributed.runs", len(summaries))
    show("distributed.commits", sorted({s["git_commit"][:7] for s in summaries}))


# ------------------------------------------------------------------ the bench files


def read_bench(folder: Path, name: str) -> dict:
    """The JSON of ``<folder>/<name>.json``."""
    return json.loads((folder / f"{name}.json").read_text())


def machine_line(name: str, m: dict) -> None:
    """A bench file's machine block as one label, and its commit as another."""
    commit = m.get("commit")
    show(
        f"{name}.machine",
        f"{m['cpu']}, {m['cpu_count']} cores, {m['torch_threads']} torch threads, "
        f"load_avg_1m {m.get('load_avg_1m')}, commit {commit[:7] if commit else None}, "
        f"dirty {m.get('dirty')}",
    )
    show(f"{name}.commit", commit[:7] if commit else None)
    show(f"{name}.cpu", m["cpu"])


def bench_machines(folder: Path) -> None:
    """Each file's machine, load and commit, and whether one machine at one commit made all;
    the training-state file's too (Figure 2's memory, outside the sitting)."""
    blocks = {name: read_bench(folder, name)["machine"] for name in BENCH_FILES}
    for name, m in blocks.items():
        machine_line(name, m)
    if (folder / "training_state.json").is_file():
        state = read_bench(folder, "training_state")
        machine_line("training_state", state["machine"])
        for row in state["rows"]:  # the step's peak working memory, beside epoch_1t's peak_step
            show(f"training_state.{row['row']}.step_peak", mib(row["step_peak"]))
    show("bench.cpus", sorted({m["cpu"] for m in blocks.values()}))
    show("bench.commits", sorted({str(m.get("commit"))[:7] for m in blocks.values()}))
    show("bench.all_clean", all(m.get("dirty") is False for m in blocks.values()))
    loads = [m["load_avg_1m"] for m in blocks.values() if m.get("load_avg_1m") is not None]
    show("bench.load_avg_1m", span(loads, 2) if loads else None)


def bench_epoch(folder: Path, name: str) -> None:
    """Every row of an ``epoch`` file: ratio to classic RR, ms, epoch seconds, overhead over
    functional RR (Table 1's), stages, peak step memory, operators; then the ranges quoted."""
    data = read_bench(folder, name)
    rows = {r["row"]: r for r in data["rows"]}
    rr = rows["rr"]["step_ms"]
    for row, r in rows.items():
        label = f"{name}.{row}"
        show(f"{label}.ratio", f"{r['ratio_to_classic_rr']:.2f}")
        if row in TARGETS:
            met = "met" if r["ratio_to_classic_rr"] <= TARGETS[row] else "missed"
            show(f"{label}.target", f"<= {TARGETS[row]} ({met})")
        show(f"{label}.step_ms", f"{r['step_ms']:.2f}")
        show(f"{label}.epoch_s", f"{r['epoch_s']:.1f}")
        show(f"{label}.overhead_vs_rr_pct", f"{100 * (r['step_ms'] / rr - 1):+.0f}")
        for stage, ms in r["breakdown_ms"].items():
            if ms is not None:
                show(f"{label}.{stage}_ms", f"{ms:.2f}")
        show(f"{label}.peak_step", mib(r["peak_step_bytes"]))
        _row_operators(label, r.get("operators", {}))
        eager = rows.get(row.removesuffix(":graph"))
        if row.endswith(":graph") and eager is not None:
            show(f"{label}.over_eager_pct", f"{100 * (r['step_ms'] / eager['step_ms'] - 1):+.1f}")
        twin = rows.get(f"{row}@hooks")
        if twin is not None and twin["method"] == r["method"]:  # the same code, run twice
            show(
                f"{label}.same_code_vs_hooks_row_pct",
                f"{100 * (twin['step_ms'] / r['step_ms'] - 1):+.0f}",
            )
    _stages_below_step(name, rows)
    table1 = [rows[row] for row in TABLE1_ROWS]
    show(f"{name}.table1.epoch_s", span([r["epoch_s"] for r in table1], 0))
    per_sample = [r["breakdown_ms"]["grads"] for r in table1[1:]]
    classic = rows["rr-classic"]["breakdown_ms"]["grads"]
    show(f"{name}.table1.per_sample_grads_ms", span(per_sample, 2))
    factored = [r["breakdown_ms"]["grads"] for r in table1 if r["method"] == "factored"]
    if factored:
        show(f"{name}.table1.factored_grads_ms", span(factored, 1))
    show(f"{name}.table1.per_sample_grads_over_classic", span([g / classic for g in per_sample], 1))
    _peak_spans(name, rows)
    if "operators" in rows["rr"]:
        _operator_spans(name, rows)
    vrgd = [r for row, r in rows.items() if "+vr_" in row]
    if vrgd:
        show(f"{name}.vrgd_rows.gsnr_ms", span([r["breakdown_ms"]["gsnr"] for r in vrgd], 1))
        with_rr = [r["ratio_to_classic_rr"] for r in vrgd if r["row"].startswith("rr+")]
        show(f"{name}.vrgd_rows.rr_ratio", span(with_rr, 2))
    mean, pair = rows["mean"]["epoch_s"], rows["pair"]["epoch_s"]
    show(f"{name}.mean.100_epochs_min", f"{100 * mean / 60:.0f}")
    # README.md's multirun: balance=mean,pair x seed=0,1, 100 epochs each, one after another
    show(f"{name}.multirun_mean_pair_2_seeds_100_epochs_h", f"{2 * 100 * (mean + pair) / 3600:.1f}")


def _row_operators(label: str, operators: dict[str, dict]) -> None:
    """One row's operators per step: ``eager`` and ``cuda_path``, the total, the stages in one
    line and each stage; ``captured``, those outside the graph and the graph's kernels."""
    for path, counts in operators.items():  # eager, cuda_path, captured
        if path == "captured":  # per step outside the graph, and the graph's kernels
            show(f"{label}.operators.captured.per_step", counts["per_step"])
            show(f"{label}.operators.captured.kernels", counts["kernels"])
            continue
        suffix = "" if path == "eager" else f".{path}"
        show(f"{label}.operators{suffix}", counts["total"])
        stages = {stage: n for stage, n in counts.items() if stage != "total"}
        show(f"{label}.operators{suffix}.stages", ", ".join(f"{k} {n}" for k, n in stages.items()))
        for stage, n in stages.items():
            show(f"{label}.operators{suffix}.{stage}", n)


def _stages_below_step(name: str, rows: dict[str, dict]) -> None:
    """In how many rows with a breakdown the timed stages add up to less than ``step_ms``, and
    the rows where they do not."""
    staged = [r for r in rows.values() if any(ms is not None for ms in r["breakdown_ms"].values())]
    covered = [
        r["row"] for r in staged if sum(filter(None, r["breakdown_ms"].values())) >= r["step_ms"]
    ]
    show(f"{name}.stages_below_step", f"{len(staged) - len(covered)} of {len(staged)} rows")
    show(f"{name}.stages_not_below_step", covered)


def _peak_spans(name: str, rows: dict[str, dict]) -> None:
    """The peak step memory (MiB) of Table 1's per-sample rows, eager and traced (``:graph``)."""
    eager = [rows[row]["peak_step_bytes"] / MIB for row in TABLE1_ROWS[1:]]
    show(f"{name}.table1.per_sample_peak_step", span(eager, 2))
    graphs = [rows[f"{row}:graph"] for row in TABLE1_ROWS[1:] if f"{row}:graph" in rows]
    if graphs:
        traced = [r["peak_step_bytes"] / MIB for r in graphs]
        show(f"{name}.table1.graph.per_sample_peak_step", span(traced, 2))


def _operator_spans(name: str, rows: dict[str, dict]) -> None:
    """The operator counts the page gives for groups of rows (``operators``): the gradient stage
    of Table 1's factored rows and of their ``@hooks`` rows, SGD's stage in Table 1's rows, the
    GSNR stage of the VRGD rows; captured, the operators outside the graph of every row and the
    graph's kernels minus the row's CUDA path (Table 1's rows, the VRGD rows)."""

    def eager(group: list[dict], stage: str) -> str:
        return span([r["operators"]["eager"][stage] for r in group], 0)

    table1 = [rows[row] for row in TABLE1_ROWS]
    factored = [r for r in table1 if r["method"] == "factored"]
    hooks = [rows[f"{row}@hooks"] for row in TABLE1_ROWS[1:] if f"{row}@hooks" in rows]
    vrgd = [r for row, r in rows.items() if "+vr_" in row]
    show(f"{name}.table1.factored.operators.grads", eager(factored, "grads"))
    if hooks:
        show(f"{name}.table1.hooks.operators.grads", eager(hooks, "grads"))
    show(f"{name}.table1.operators.opt", eager(table1, "opt"))
    show(f"{name}.vrgd_rows.operators.gsnr", eager(vrgd, "gsnr"))
    captured = [r["operators"]["captured"] for r in rows.values() if "captured" in r["operators"]]
    if not captured:
        return
    show(f"{name}.operators.captured.per_step", span([c["per_step"] for c in captured], 0))
    for group, key in ((table1, "table1"), (vrgd, "vrgd_rows")):
        extra = [
            r["operators"]["captured"]["kernels"] - r["operators"]["cuda_path"]["total"]
            for r in group
        ]
        show(f"{name}.{key}.operators.captured.kernels_minus_cuda_path", span(extra, 0))
        kernels = [r["operators"]["captured"]["kernels"] for r in group]
        show(f"{name}.{key}.operators.captured.kernels", span(kernels, 0))


#: an operator under this many ms per step (or its change) is summed into "smaller operators"
SHOWN_MS = 0.05


def _op_items(ops: dict[str, float], other: float) -> str:
    """``outside operators +1.00, convolution_backward +0.95, ..., smaller operators +0.12``: the
    time outside operators first, then every operator of at least SHOWN_MS either way, the rest
    summed."""
    shown = {k: v for k, v in ops.items() if abs(v) >= SHOWN_MS}
    rest = sum(v for k, v in ops.items() if k not in shown)
    items = [("outside operators", other), *sorted(shown.items(), key=lambda kv: -abs(kv[1]))]
    items.append(("smaller operators", rest))
    return ", ".join(f"{name.removeprefix('aten::')} {value:+.2f}" for name, value in items)


def bench_profile(folder: Path, name: str) -> None:
    """Where Table 1's steps spend their time (``profile``: torch.profiler, ms per step, with
    its own cost in every operator), and where each row's time over classic RR's goes, per stage
    and operator; then the unprofiled time over each row's target."""
    rows = {r["row"]: r for r in read_bench(folder, name)["rows"]}
    if rows["rr-classic"].get("profile") is None:
        return
    _profiled_over_timed(rows, name)
    classic = rows["rr-classic"]
    for row in TABLE1_ROWS:
        profile, label = rows[row]["profile"], f"{name}.{row}.profile"
        show(f"{label}.total_ms", f"{sum(s['ms'] for s in profile.values()):.2f}")
        for stage, times in profile.items():
            ops = {op: t["ms"] for op, t in times["ops"].items()}
            show(f"{label}.{stage}", f"{times['ms']:.2f}: {_op_items(ops, times['other_ms'])}")
            show(f"{label}.{stage}_ms", f"{times['ms']:.2f}")
        ordering = profile["ordering"]
        show(f"{label}.ordering.outside_ms", f"{ordering['other_ms']:.2f}")
        for op, t in ordering["ops"].items():
            if t["ms"] >= SHOWN_MS:
                show(f"{label}.ordering.{op.removeprefix('aten::')}_ms", f"{t['ms']:.2f}")
        if row != "rr-classic":
            _over_classic(name, row, rows[row], classic)
    show(f"{name}.profile.shown_ms", f"{SHOWN_MS:.2f}")
    _profile_ranges(rows, name)


def _op_ms(times: dict, op: str) -> float:
    """The profiled ms of operator ``op`` (``aten::`` left off) in one stage, 0 when absent."""
    return times["ops"].get(f"aten::{op}", {"ms": 0.0})["ms"]


def _profile_ranges(rows: dict[str, dict], name: str) -> None:
    """The ranges the page quotes: the per-sample stage of Table 1's per-sample rows and the
    ordering stage of mean, pair and batch, over classic RR's (timed and profiled, its time
    outside operators and its main operators) and profiled over timed; recursive's gather and
    product operators."""
    classic = rows["rr-classic"]
    base = classic["profile"]
    per_sample = [rows[row] for row in TABLE1_ROWS[1:]]
    grads = [(r["profile"]["grads"], base["grads"]) for r in per_sample]
    label = f"{name}.table1.over_classic"
    timed = [r["breakdown_ms"]["grads"] - classic["breakdown_ms"]["grads"] for r in per_sample]
    show(f"{name}.table1.over_classic_timed.grads", span(timed, 2))
    show(f"{label}.grads", span([g["ms"] - b["ms"] for g, b in grads], 2))
    show(f"{label}.grads.outside", span([g["other_ms"] - b["other_ms"] for g, b in grads], 2))
    contiguous = [_op_ms(g, "contiguous") - _op_ms(b, "contiguous") for g, b in grads]
    show(f"{label}.grads.contiguous", span(contiguous, 2))
    conv = [abs(_op_ms(g, "convolution_backward") - _op_ms(b, "convolution_backward"))
            for g, b in grads]  # fmt: skip
    show(f"{label}.grads.convolution_backward_max_abs", f"{max(conv):.2f}")
    over = [
        g["ms"] / r["breakdown_ms"]["grads"] for r, (g, _) in zip(per_sample, grads, strict=True)
    ]
    show(f"{name}.table1.profile.grads.over_timed", span(over, 2))
    three = [rows[row] for row in ("mean", "pair", "batch")]
    order = [(r["profile"]["ordering"], base["ordering"]) for r in three]
    label = f"{name}.mean_pair_batch.over_classic.ordering"
    show(f"{label}.outside", span([o["other_ms"] - b["other_ms"] for o, b in order], 2))
    products = [sum(_op_ms(o, op) - _op_ms(b, op) for op in ("matmul", "baddbmm_", "addmm"))
                for o, b in order]  # fmt: skip
    show(f"{label}.products", span(products, 2))
    smaller = []
    for o, b in order:
        names = set(o["ops"]) | set(b["ops"])
        diff = {op: _op_ms(o, op.removeprefix("aten::")) - _op_ms(b, op.removeprefix("aten::"))
                for op in names}  # fmt: skip
        smaller.append(sum(v for v in diff.values() if abs(v) < SHOWN_MS))
    show(f"{label}.smaller", span(smaller, 2))
    over = [o["ms"] / r["breakdown_ms"]["ordering"] for r, (o, _) in zip(three, order, strict=True)]
    show(f"{name}.mean_pair_batch.profile.ordering.over_timed", span(over, 2))
    ordering = rows["recursive"]["profile"]["ordering"]
    gathers = ("matmul", "addmm_", "index_copy_", "index_select")
    show(f"{name}.recursive.profile.ordering.products_and_copies_ms",
         f"{sum(_op_ms(ordering, op) for op in gathers):.2f}")  # fmt: skip


def _profiled_over_timed(rows: dict[str, dict], name: str) -> None:
    """Every profiled row's profiled step over its timed one, and the ranges of Table 1's and of
    the VRGD rows."""
    over_timed = {}
    for row, r in rows.items():
        if r.get("profile"):
            over_timed[row] = sum(s["ms"] for s in r["profile"].values()) / r["step_ms"]
            show(f"{name}.{row}.profile.over_timed", f"{over_timed[row]:.2f}")
    show(f"{name}.table1.profile.over_timed", span([over_timed[r] for r in TABLE1_ROWS], 2))
    vrgd_rows = [v for row, v in over_timed.items() if "+vr_" in row]
    show(f"{name}.vrgd_rows.profile.over_timed", span(vrgd_rows, 2))


def _over_classic(name: str, row: str, r: dict, classic: dict) -> None:
    """Row ``row`` (``r``) of file ``name``: its stages over classic RR's (timed, profiled over
    timed, profiled by operator) and its timed step over its target."""
    label, profile, base_profile = f"{name}.{row}", r["profile"], classic["profile"]
    for stage, timed in r["breakdown_ms"].items():
        if timed is not None and stage in profile:
            extra = timed - classic["breakdown_ms"].get(stage, 0.0)
            show(f"{label}.over_classic_timed.{stage}", f"{extra:+.2f}")
            show(f"{label}.profile.{stage}.over_timed", f"{profile[stage]['ms'] / timed:.2f}")
    for stage, times in profile.items():
        base = base_profile.get(stage, {"ms": 0.0, "other_ms": 0.0, "ops": {}})
        names = set(times["ops"]) | set(base["ops"])
        diff = {
            op: times["ops"].get(op, {"ms": 0.0})["ms"] - base["ops"].get(op, {"ms": 0.0})["ms"]
            for op in names
        }
        items = _op_items(diff, times["other_ms"] - base["other_ms"])
        show(f"{label}.over_classic.{stage}", f"{times['ms'] - base['ms']:+.2f}: {items}")
    if row in TARGETS:
        over = r["step_ms"] - TARGETS[row] * classic["step_ms"]
        show(f"{label}.over_target_ms", f"{over:+.2f}")


def bench_orderings(folder: Path) -> None:
    """One step of each ordering alone; recursive at every depth and how its time grows."""
    depths = {}
    for r in read_bench(folder, "orderings")["rows"]:
        depth = r.get("depth")
        label = "orderings." + r["variant"] + ("" if depth is None else f".D{depth}")
        show(
            f"{label}.step_ms",
            f"{r['step_ms']:.2f}" if r["step_ms"] >= 0.1 else f"{r['step_ms']:.2g}",
        )
        show(f"{label}.state", mb(r["state_bytes"]))
        if r["variant"] == "recursive" and depth is not None:
            depths[depth] = r["step_ms"]
    if len(depths) < 2:
        return
    order = sorted(depths)
    for low, high in itertools.pairwise(order):
        show(f"orderings.recursive.D{high}_over_D{low}", f"{depths[high] / depths[low]:.2f}")
    low, high = order[0], order[-1]
    show(f"orderings.recursive.D{high}_over_D{low}", f"{depths[high] / depths[low]:.2f}")
    show(
        f"orderings.recursive.D{high}_over_D{low}.if_linear_in_D+1", f"{(high + 1) / (low + 1):.2f}"
    )
    show(f"orderings.recursive.D{high}_over_D{low}.if_doubling_per_level", 2 ** (high - low))
    show("orderings.recursive.ms_per_level", f"{(depths[high] - depths[low]) / (high - low):.2f}")


def bench_projection(folder: Path) -> None:
    """Mean and recursive with and without each sketch on the 1.7M-parameter MLP."""
    data = read_bench(folder, "projection")
    for method, ms in data["grads_ms"].items():
        show(f"projection.grads_ms.{method}", f"{ms:.1f}")
    show("projection.materialize_ms", f"{data['materialize_ms']:.1f}")
    for r in data["rows"]:
        label = f"projection.{r['variant']}.{r['projection_kind'] or 'unprojected'}"
        show(f"{label}.step_ms", f"{r['step_ms']:.1f}")
        show(f"{label}.step_ratio", f"{r['step_ratio']:.2f}")
        if r["projection_kind"]:
            show(f"{label}.speedup_vs_unprojected", f"{1 / r['step_ratio']:.2g}")
        show(f"{label}.state", mb(r["state_bytes"]))
        show(f"{label}.scratch", mb(r["scratch_bytes"]))
        show(f"{label}.step_peak", mb(r["step_peak_bytes"]))
    sketched = [r["step_ms"] for r in data["rows"] if r["projection_kind"]]
    show("projection.sketched.step_ms", span(sketched, 0))


def bench_rss(folder: Path) -> None:
    """Peak RSS of each arm of the 10.5M-parameter MLP step."""
    data = read_bench(folder, "rss")
    rows = {r["arm"]: r for r in data["rows"]}
    for arm, r in rows.items():
        show(f"rss.{arm}.peak_rss", mib(r["peak_rss_bytes"]))
        show(f"rss.{arm}.above_classic", mib(r["above_classic_bytes"]))
        show(f"rss.{arm}.state", mib(r["state"]))
    factored = rows["mean-factored"]
    show(
        "rss.mean-factored.above_classic_minus_state",
        mib(factored["above_classic_bytes"] - factored["state"]),
    )
    show("rss.allowed_above_classic", mib(factored["allowed_bytes"]))
    show("rss.per_sample_buffer", mib(data["settings"]["batch"] * factored["d"] * 4))
    show("rss.check_accumulator", mib(factored["d"] * 4))  # the rows' mean check's (d,), kept


def bench_conv(folder: Path) -> None:
    """Per-sample convolution weight gradients: every formulation at every layer shape."""
    faster = {True: [], False: []}  # channels-last over the default layout, by C < 8
    rows = read_bench(folder, "conv")["rows"]
    show("conv.shapes", len(rows))
    for r in rows:
        label = f"conv.{r['C']}to{r['O']}_k{r['kernel']}_H{r['H']}"
        ms = r["ms"]
        for form, value in ms.items():
            show(f"{label}.{form}_ms", f"{value:.2f}")
        speedup = ms["groups_weight_grad"] / ms["groups_weight_grad_cl"]
        show(f"{label}.default_over_channels_last", f"{speedup:.2f}")
        chosen = ms["groups_weight_grad_cl" if r["C"] < 8 else "groups_weight_grad"]
        show(f"{label}.chosen_over_classic", f"{chosen / ms['classic']:.2f}")
        faster[r["C"] < 8].append(speedup)
    for narrow, speedups in faster.items():
        label = "conv.below_8_channels" if narrow else "conv.from_8_channels"
        wins = [s for s in speedups if s > 1]
        show(f"{label}.channels_last_faster", f"{len(wins)} of {len(speedups)}")
        if wins:
            show(f"{label}.channels_last_speedup_where_faster", span(wins, 1))


def bench_vrgd(folder: Path) -> None:
    """The VRGD arms at large batch: times, GSNR, each VR arm over its own plain optimizer."""
    bench = pd.DataFrame(read_bench(folder, "vrgd")["rows"])
    for r in bench.itertuples():
        label = f"vrgd.{r.arm}.B{r.batch_size}"
        show(f"{label}.step_ms", f"{r.step_ms:.1f}")
        show(f"{label}.epoch_s", f"{r.epoch_s:.1f}")
        if not pd.isna(r.gsnr_ms):
            show(f"{label}.gsnr_ms", f"{r.gsnr_ms:.1f}")
    times = bench.pivot(index="batch_size", columns="arm", values="step_ms")
    for vr, plain in (("vr_momentum", "sgd_momentum"), ("vr_adam", "adam")):
        ratios = times[vr] / times[plain]
        for batch, ratio in ratios.items():
            show(f"vrgd.{vr}_over_{plain}.B{batch}", f"{ratio:.2f}")
        show(f"vrgd.{vr}_over_{plain}", span(ratios, 2))
    gsnr = bench.dropna(subset=["gsnr_ms"]).groupby("batch_size")["gsnr_ms"]
    for batch, values in gsnr:
        show(f"vrgd.gsnr_ms.B{batch}", span(values, 0))


def bench_sweep(folder: Path) -> None:
    """Table 1 jobs in parallel: wall time, speed-up, epoch time, loss differences."""
    for r in read_bench(folder, "sweep")["results"]:
        label = f"sweep.{r['setting']}"
        show(f"{label}.wall_s", f"{r['wall_s']:.1f}")
        show(f"{label}.speedup_vs_sequential", f"{r['speedup_vs_sequential']:.2f}")
        show(f"{label}.jobs_per_hour", f"{r['jobs_per_hour']:.0f}")
        show(f"{label}.median_epoch_s", f"{r['median_epoch_s']:.1f}")
        show(
            f"{label}.max_abs_loss_diff_vs_sequential",
            f"{r['max_abs_loss_diff_vs_sequential']:.1e}",
        )
        show(f"{label}.torch_threads_seen", r["torch_threads_seen"])
        show(f"{label}.jobs", r["jobs"])
        show(f"{label}.processes", r["processes"])


def _before_after(label: str, old: dict, new: dict, keys: tuple[str, ...], digits: int) -> None:
    """``old -> new`` of the values at ``keys`` (nested) in two rows, when both have them."""
    values = []
    for row in (old, new):
        for key in keys:
            row = row.get(key) if isinstance(row, dict) else None
        values.append(row)
    if None not in values:
        show(label, " -> ".join(f"{v:.{digits}f}" for v in values))


def bench_before(folder: Path) -> None:
    """The same sitting's runs at the commit before (``before/``): each Table 1 and VRGD row's
    step, ratio, stages and operators before and after, and the orderings' steps."""
    before = folder / "before"
    if not before.is_dir():
        return
    show("before.commit", (before / "commit.txt").read_text().strip()[:7])
    show("before.epoch_1t_2t.same_operators", _same_operators(before))
    for name in ("epoch_1t", "epoch_2t"):
        old = {r["row"]: r for r in read_bench(before, name)["rows"]}
        new = {r["row"]: r for r in read_bench(folder, name)["rows"]}
        for row in [r for r in old if r in new and "@" not in r]:  # Table 1's and the VRGD rows
            label = f"before.{name}.{row}"
            _before_after(f"{label}.step_ms", old[row], new[row], ("step_ms",), 2)
            if row != TABLE1_ROWS[0]:
                _before_after(f"{label}.ratio", old[row], new[row], ("ratio_to_classic_rr",), 2)
            for stage in ("ordering", "gsnr", "opt"):
                keys = ("breakdown_ms", stage)
                _before_after(f"{label}.{stage}_ms", old[row], new[row], keys, 2)
            keys = ("operators", "eager", "total")
            _before_after(f"{label}.operators", old[row], new[row], keys, 0)
            for stage in ("ordering", "gsnr", "opt"):
                keys = ("operators", "eager", stage)
                _before_after(f"{label}.operators.{stage}", old[row], new[row], keys, 0)
        _before_ranges(name, old, new)
    old = {r["variant"]: r["step_ms"] for r in read_bench(before, "orderings")["rows"]}
    new = {
        r["variant"]: r["step_ms"]
        for r in read_bench(folder, "orderings")["rows"]
        if r.get("depth", 5) == 5
    }
    for variant in GRAB:
        show(f"before.orderings.{variant}.step_ms", f"{old[variant]:.2f} -> {new[variant]:.2f}")
    others = [v for v in GRAB if v != "recursive"]
    change = [new[v] - old[v] for v in others]
    show("before.orderings.but_recursive.step_ms_change", signed_span(change, 2))


def _before_ranges(name: str, old: dict[str, dict], new: dict[str, dict]) -> None:
    """Before -> after over rows of one ``epoch`` file: Table 1's ratios, the steps, ordering
    stages and operators of its rows but classic RR and recursive, and the VRGD rows' ratios
    (with RR) and GSNR stages."""
    label = f"before.{name}"
    ratio = [new[r]["ratio_to_classic_rr"] - old[r]["ratio_to_classic_rr"] for r in TABLE1_ROWS[1:]]
    show(f"{label}.table1.ratio_change", signed_span(ratio, 2))
    others = [r for r in TABLE1_ROWS[1:] if r != "recursive"]
    step = [new[r]["step_ms"] - old[r]["step_ms"] for r in others]
    show(f"{label}.table1_but_recursive.step_ms_change", signed_span(step, 2))
    ordering = [
        new[r]["breakdown_ms"]["ordering"] - old[r]["breakdown_ms"]["ordering"] for r in others
    ]
    show(f"{label}.table1_but_recursive.ordering_ms_change", signed_span(ordering, 2))
    ops = [
        new[r]["operators"]["eager"]["total"] - old[r]["operators"]["eager"]["total"]
        for r in others
    ]
    show(f"{label}.table1_but_recursive.operators_change", signed_span(ops, 0))
    vrgd = [r for r in old if "+vr_" in r and r in new]
    gsnr_ops = [
        span([side[r]["operators"]["eager"]["gsnr"] for r in vrgd], 0) for side in (old, new)
    ]
    show(f"{label}.vrgd_rows.operators.gsnr", " -> ".join(gsnr_ops))
    with_rr = [r for r in vrgd if r.startswith("rr+")]
    for key, rows, digits in (("rr_ratio", with_rr, 2), ("gsnr_ms", vrgd, 2)):
        spans = [
            span([(r["ratio_to_classic_rr"] if key == "rr_ratio" else r["breakdown_ms"]["gsnr"])
                  for r in (side[row] for row in rows)], digits)
            for side in (old, new)
        ]  # fmt: skip
        show(f"{label}.vrgd_rows.{key}", " -> ".join(spans))


def bench_per_sample(folder: Path) -> None:
    """Each model's per-sample paths over its plain step (``per_sample.json``)."""
    report = read_bench(folder, "per_sample")
    machine_line("per_sample", report["machine"])
    show("per_sample.load_avg_1m", report["machine"]["load_avg_1m"])
    for row in report["rows"]:
        for path, ratio in row["over_plain"].items():
            show(f"per_sample.{row['model']}.{path}.over_plain", f"{ratio:.2f}")


#: issue 49's budget: ``auto``'s checked path, after over before (x plain), per model
PER_SAMPLE_BUDGET = {"lenet": 1.15, "other": 1.05}
#: issue 49's budget for the check's amortized cost in ``bench epoch``, in %
CHECK_BUDGET_PCT = 3.0


def bench_per_sample_sitting(folder: Path, name: str = "per_sample_sitting") -> None:
    """The before/after sitting of ``scripts/per_sample_sitting.sh`` in ``folder/name``: per
    model, each round's ratio of the checked default path's cost over a plain step after to
    before, and their median (``>1``: the path costs more than it did, relative to a plain step
    timed beside it); each side's ratios to plain over the rounds; the allocator settings."""
    sitting = folder / name
    show(f"{name}.before_commit", (sitting / "before_commit.txt").read_text()[:7])
    rounds = list(_sitting_rounds(sitting))
    show(f"{name}.rounds", len(rounds))
    show(f"{name}.one_process", all(one for _, _, one, _ in rounds))
    ratios: dict[str, list[float]] = {}
    checks: dict[str, list[float]] = {}
    bare: dict[str, list[float]] = {}  # after with the check off, over before with it on
    sides: dict[tuple[str, str], list[float]] = {}  # (model, side) -> its ratios to plain
    for stem, machine, _, models in rounds:
        machine_line(f"{name}.{stem}", machine)
        show(f"{name}.{stem}.load_avg_1m", machine["load_avg_1m"])
        show(f"{name}.{stem}.malloc", machine.get("malloc", "not recorded"))
        for model, (path, before, after, unchecked) in models.items():
            ratios.setdefault(model, []).append(after / before)
            sides.setdefault((model, "after"), []).append(after)
            sides.setdefault((model, "before"), []).append(before)
            if unchecked:
                checks.setdefault(model, []).append(100 * (after / unchecked - 1))
                bare.setdefault(model, []).append(unchecked / before)
            show(f"{name}.{stem}.{model}.path", path)
    for model, values in ratios.items():
        show(f"{name}.{model}.after_over_before", span(values, 3))
        middle = statistics.median(values)
        show(f"{name}.{model}.after_over_before_median", f"{middle:.3f}")
        budget = PER_SAMPLE_BUDGET.get(model, PER_SAMPLE_BUDGET["other"])
        show(f"{name}.{model}.budget", f"{budget:.2f}")
        within = sum(v <= budget for v in values)
        show(f"{name}.{model}.rounds_within_budget", f"{within} of {len(values)}")
    for (model, side), values in sides.items():
        show(f"{name}.{model}.{side}_over_plain", span(values, 3))
    sitting_plain_steps(sitting, name)
    for model, values in checks.items():
        show(f"{name}.{model}.check_cost_pct", signed_span(values, 1))
    for model, values in bare.items():
        show(f"{name}.{model}.unchecked_over_before", span(values, 3))


def sitting_plain_steps(sitting: Path, name: str) -> None:
    """Per model, the plain step's ms over the sitting's processes (each file is one)."""
    plain: dict[str, list[float]] = {}
    for path in sorted(sitting.glob("*_*.json")):
        for row in json.loads(path.read_text())["rows"]:
            plain.setdefault(row["model"], []).append(row["ms"]["plain"])
    for model, values in plain.items():
        show(f"{name}.{model}.plain_ms", span(values, 2))


def _sitting_rounds(sitting: Path):
    """Per round: its name, machine, whether both sides ran in one process, and per model
    ``(auto's path, before, after, after unchecked)``, each over a plain step: from
    ``round_<k>.json`` (the baseline as ``@baseline``, one plain step for both), or from
    ``before_<k>.json`` and ``after_<k>.json`` (a process per side, each its own plain step)."""
    for path in sorted(sitting.glob("round_*.json")):
        report = json.loads(path.read_text())
        models = {}
        for row in report["rows"]:
            auto, after = _auto_path(row)
            before = next(
                v
                for k, v in row["over_plain"].items()
                if k.startswith("auto:") and k.endswith("@baseline")
            )
            models[row["model"]] = (auto, before, after, row["over_plain"].get(f"{auto}@unchecked"))
        yield path.stem, report["machine"], True, models
    for path in sorted(sitting.glob("after_*.json")):
        before = json.loads((sitting / path.name.replace("after", "before")).read_text())
        after = json.loads(path.read_text())
        old = {r["model"]: _auto_path(r)[1] for r in before["rows"]}
        models = {}
        for row in after["rows"]:
            auto, ratio = _auto_path(row)
            unchecked = row["over_plain"].get(f"{auto}@unchecked")
            models[row["model"]] = (auto, old[row["model"]], ratio, unchecked)
        yield path.stem, after["machine"], False, models


def _auto_path(row: dict) -> tuple[str, float]:
    """``auto``'s path in a per_sample row (``auto:<path>``, checked) and its ratio to plain."""
    path = next(p for p in row["over_plain"] if p.startswith("auto:") and "@" not in p)
    return path, row["over_plain"][path]


def bench_check_cost(folder: Path) -> None:
    """The per-sample check's amortized cost (``epoch_check_1t.json``): each per-sample row's
    mean step (checked calls counted) over its ``@unchecked`` twin's, in %, and their range."""
    report = read_bench(folder, "epoch_check_1t")
    machine_line("epoch_check_1t", report["machine"])
    rows = {r["row"]: r for r in report["rows"]}
    costs = []
    for row, r in rows.items():
        twin = rows.get(f"{row}@unchecked")
        if twin is not None:
            costs.append(100 * (r["mean_step_ms"] / twin["mean_step_ms"] - 1))
            show(f"epoch_check_1t.{row}.check_cost_pct", f"{costs[-1]:+.1f}")
    show("epoch_check_1t.check_cost_pct", signed_span(costs, 1))
    show("epoch_check_1t.budget_pct", f"{CHECK_BUDGET_PCT:+.1f}")
    within = sum(c <= CHECK_BUDGET_PCT for c in costs)
    show("epoch_check_1t.rows_within_budget", f"{within} of {len(costs)}")


def bench_limits(folder: Path) -> None:
    """The stage-limits sitting (``epoch_limits_1t.json``): its machine, the rates it measured,
    and each Table 1 row's stage times as multiples of their limits."""
    report = read_bench(folder, "epoch_limits_1t")
    machine_line("epoch_limits_1t", report["machine"])
    show("epoch_limits_1t.stream_gb_s", f"{report['rates']['stream_gb_s']:.1f}")
    show("epoch_limits_1t.matmul_gflop_s", f"{report['rates']['matmul_gflop_s']:.0f}")
    for r in report["rows"]:
        for stage, multiple in r["limit_multiples"].items():
            if multiple is not None:
                show(f"epoch_limits_1t.{r['row']}.{stage}.over_limit", f"{multiple:.1f}")
                limit = r["limits"][stage]["limit_ms"]
                show(f"epoch_limits_1t.{r['row']}.{stage}.limit_ms", f"{limit:.3f}")


def _same_operators(folder: Path) -> bool:
    """Whether ``epoch_1t.json`` and ``epoch_2t.json`` in ``folder`` count the same operators
    (eager, total and per stage) in every row both have."""
    one, two = (
        {r["row"]: r["operators"]["eager"] for r in read_bench(folder, name)["rows"]
         if "eager" in r.get("operators", {})}
        for name in ("epoch_1t", "epoch_2t")
    )  # fmt: skip
    return all(two[row] == counts for row, counts in one.items() if row in two)


def bench_settings(folder: Path, name: str) -> None:
    """The options a bench file ran with (``settings``), one label each: ``<file>.settings.<key>``
    (repeats, steps, warm-up, batch, ...); its output path and command are left out."""
    for key, value in read_bench(folder, name)["settings"].items():
        if key not in ("out", "command") and not isinstance(value, (list, dict)):
            show(f"{name}.settings.{key}", value)


def bench(folder: Path) -> None:
    bench_machines(folder)
    for name in BENCH_FILES:
        bench_settings(folder, name)
    for name in ("epoch_1t", "epoch_2t"):
        bench_epoch(folder, name)
        bench_profile(folder, name)
    show("epoch_1t_2t.same_operators", _same_operators(folder))
    bench_before(folder)
    bench_orderings(folder)
    bench_projection(folder)
    bench_rss(folder)
    bench_conv(folder)
    bench_vrgd(folder)
    bench_sweep(folder)
    if (folder / "per_sample.json").is_file():
        bench_per_sample(folder)
    for sitting in ("per_sample_sitting", "per_sample_sitting_default_malloc"):
        if (folder / sitting).is_dir():
            bench_per_sample_sitting(folder, sitting)
    if (folder / "epoch_check_1t.json").is_file():
        bench_check_cost(folder)
    if (folder / "epoch_limits_1t.json").is_file():
        bench_limits(folder)


NUMBERS = RESULTS / "numbers.md"
HEADER = """# Every number the READMEs and `docs/` quote

Generated by `python scripts/results_numbers.py` from the committed runs (`results/table1/`,
`results/vrgd/`) and benchmark files (`results/bench/*.json`); do not edit it by hand (a test
fails when it is not what the script writes). A bench number is one line `label = value`, the
label naming the file, the row and the quantity; the prose quotes these labels.

```text
"""


def render(bench_folder: Path) -> str:
    """``results/numbers.md`` as the committed files give it."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        table1("table1-5-epochs", "table1")
        table1("table1", "table1_100")
        vrgd()
        distributed()
        bench(bench_folder)
    return HEADER + out.getvalue() + "```\n"


#: a quoted number in a page: ``<!--n:label-->value<!--/n-->``; the script rewrites ``value``
QUOTE = re.compile(r"<!--n:([^>\s]+)-->(.*?)<!--/n-->")


def quoting_pages(root: Path = Path(".")) -> list[Path]:
    """The pages that quote numbers.md: the README, ``docs/`` and the READMEs under results/."""
    readme = [root / "README.md"] if (root / "README.md").is_file() else []
    return [
        *readme,
        *sorted((root / "docs").glob("*.md")),
        *sorted((root / "results").glob("**/README.md")),
    ]


def labelled(numbers: str) -> dict[str, str]:
    """Every ``label = value`` line of numbers.md, as a dict."""
    pairs = (line.split(" = ", 1) for line in numbers.splitlines() if " = " in line)
    return {label: value for label, value in pairs if label and not any(c.isspace() for c in label)}


def quote(page: Path, values: dict[str, str]) -> str:
    """``page``'s text with every quoted number set to numbers.md's value of its label.

    Raises:
        ValueError: a quote names a label numbers.md does not have.
    """

    def current(match: re.Match) -> str:
        label = match.group(1)
        if label not in values:
            raise ValueError(f"{page}: quotes {label!r}, which results/numbers.md does not have")
        return f"<!--n:{label}-->{values[label]}<!--/n-->"

    return QUOTE.sub(current, page.read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", type=Path, default=RESULTS / "bench", help="the bench files")
    parser.add_argument("--out", default=str(NUMBERS), help="where to write them (- prints)")
    parser.add_argument(
        "--check", action="store_true", help="only say whether --out and the pages are current"
    )
    args = parser.parse_args(argv)
    text = render(args.bench)
    if args.out == "-":
        print(text, end="")
        return 0
    values = labelled(text)
    pages = {page: quote(page, values) for page in quoting_pages()}
    if args.check:
        stale = (
            [args.out] if not Path(args.out).is_file() or Path(args.out).read_text() != text else []
        )
        stale += [str(page) for page, new in pages.items() if page.read_text() != new]
        for name in stale:
            print(f"{name} is stale: run python scripts/results_numbers.py", file=sys.stderr)
        return 1 if stale else 0
    Path(args.out).write_text(text)
    for page, new in pages.items():
        if page.read_text() != new:
            page.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
