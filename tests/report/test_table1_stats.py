"""Table 1's paired tests (``grab_exp.report.table1_stats``) against worked examples whose
p-values are computed here by hand (the t distribution's closed forms for 1, 2 and 3 degrees of
freedom, the signed-rank test by counting sign patterns, Holm's adjustment by its definition),
and on the committed 100-epoch runs against their own ``metrics.csv`` files."""

from __future__ import annotations

import csv
import itertools
import math
from pathlib import Path

import pandas as pd
import pytest

from grab_exp.report.table1_stats import (
    FAMILY_PAIRS,
    FAMILY_VS_RR,
    FAMILY_VS_RR_EARLY,
    holm,
    paired_test,
    paired_tests,
    windows,
)

REPO = Path(__file__).resolve().parents[2]
RUNS = REPO / "results" / "table1" / "runs"


def t_p_two_sided(t: float, df: int) -> float:
    """The two-sided p of Student's t by its closed forms (df 1: Cauchy; 2; 3)."""
    t = abs(t)
    if df == 1:
        return 1 - 2 / math.pi * math.atan(t)
    if df == 2:
        return 1 - t / math.sqrt(2 + t * t)
    if df == 3:
        x = t / math.sqrt(3)
        return 1 - 2 / math.pi * (x / (1 + x * x) + math.atan(x))
    raise ValueError(df)


def signed_rank_p(diff: list[float]) -> float:
    """The exact two-sided signed-rank p by enumerating every sign pattern of the ranks."""
    ranks = {v: i + 1 for i, v in enumerate(sorted(abs(d) for d in diff))}
    w_plus = sum(ranks[abs(d)] for d in diff if d > 0)
    totals = [
        sum(r for r, s in zip(ranks.values(), signs, strict=True) if s)
        for signs in itertools.product((0, 1), repeat=len(diff))
    ]
    low = min(w_plus, sum(ranks.values()) - w_plus)
    return min(1.0, 2 * sum(total <= low for total in totals) / len(totals))


@pytest.mark.parametrize(
    ("values", "others"),
    [
        ([3.0, 5.0], [2.0, 2.0]),  # differences 1, 3: t = 2, df 1
        ([1.0, 2.0, 3.0], [0.0, 0.0, 0.0]),  # differences 1, 2, 3: t = 2 sqrt(3), df 2
        ([0.5, 0.7, 0.2, 0.9], [0.4, 0.1, 0.35, 0.2]),  # 0.1, 0.6, -0.15, 0.7: df 3
    ],
)
def test_the_paired_t_test_matches_the_closed_form(values, others):
    diff = [a - b for a, b in zip(values, others, strict=True)]
    n, mean = len(diff), sum(diff) / len(diff)
    sd = math.sqrt(sum((d - mean) ** 2 for d in diff) / (n - 1))
    t = mean / (sd / math.sqrt(n))
    test = paired_test(values, others, sign=1)
    assert (test.n, test.mean, test.sd) == (n, pytest.approx(mean), pytest.approx(sd))
    assert test.t == pytest.approx(t)
    assert test.p == pytest.approx(t_p_two_sided(t, n - 1), rel=1e-9)
    assert test.signed_rank_p == pytest.approx(signed_rank_p(diff))
    assert test.better == sum(d > 0 for d in diff)


def test_worked_example_values():
    """The numbers of the example in the docs: differences 1, 2, 3 give t = 3.4641 and
    p = 1 - 2 sqrt(3) / sqrt(14) = 0.0742; all three of one sign give a signed-rank p of 0.25,
    the smallest it can reach with 3 pairs."""
    test = paired_test([1.0, 2.0, 3.0], [0.0, 0.0, 0.0], sign=-1)
    assert test.t == pytest.approx(3.4641016)
    assert test.p == pytest.approx(0.0741799, abs=1e-7)
    assert test.signed_rank_p == pytest.approx(0.25)
    assert test.better == 0  # lower is better here: the row is worse on every seed


def test_no_spread_gives_no_t_and_fewer_than_two_pairs_are_refused():
    same = paired_test([1.0, 2.0, 3.0], [0.5, 1.5, 2.5], sign=1)
    assert same.sd == 0 and math.isnan(same.t) and math.isnan(same.p)
    with_zero = paired_test([1.0, 2.0, 3.0], [1.0, 1.0, 1.0], sign=1)
    assert math.isnan(with_zero.signed_rank_p)  # a zero difference: no exact signed-rank p
    with pytest.raises(ValueError, match=">= 2"):
        paired_test([1.0], [0.0], sign=1)


def test_holm_by_its_definition():
    # sorted: 0.005 x 4 = 0.02, 0.01 x 3 = 0.03, 0.03 x 2 = 0.06, 0.04 x 1 = 0.04 -> 0.06 (monotone)
    assert holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    adjusted = holm([float("nan"), 0.01, 0.02])  # NaN is not counted: m = 2
    assert math.isnan(adjusted[0]) and adjusted[1:] == pytest.approx([0.02, 0.02])
    assert holm([0.6, 0.7]) == [1.0, 1.0]  # capped at 1


def test_windows_of_short_and_long_runs():
    long = windows(100, 5)
    assert [w.label for w in long[FAMILY_VS_RR]] == ["epoch 100", "epochs 91-100 (mean)"]
    assert long[FAMILY_VS_RR][1].epochs == tuple(range(91, 101))
    assert [w.label for w in long[FAMILY_VS_RR_EARLY]] == ["epoch 5"]
    short = windows(5, 5)
    assert [w.label for w in short[FAMILY_PAIRS]] == ["epoch 5"] and not short[FAMILY_VS_RR_EARLY]


def _metrics(run: Path) -> list[dict[str, str]]:
    with (run / "metrics.csv").open(newline="") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.skipif(not RUNS.is_dir(), reason="no committed results/table1/runs")
def test_the_committed_tests_are_the_hand_computed_ones():
    """Every GraB row against RR (functional) on the committed runs, read from their
    metrics.csv with the csv module: the epoch-100 value and the epochs 91-100 mean, the paired
    t by hand, its p by the closed form, Holm over the family by hand."""
    from grab_exp.report import read_runs, runs_frame

    tests = paired_tests(runs_frame(read_runs([RUNS])), early_epoch=5)
    final = tests[tests["family"] == FAMILY_VS_RR]
    assert len(final) == 5 * 2 * 2  # variants x metrics x windows
    seeds = sorted(int(p.name.removeprefix("seed")) for p in (RUNS / "rr").iterdir())
    expected = []
    labels = {"mean": "Mean", "pair": "Pair", "batch": "Batch", "recursive": "Recursive"}
    for row, label in [*labels.items(), ("recursive_pair", "Recursive pair")]:
        for metric, (first, last) in itertools.product(
            ("train/loss", "test/acc"), ((100, 100), (91, 100))
        ):
            diff = []
            for seed in seeds:
                mine, base = (
                    [float(r[metric]) for r in _metrics(RUNS / name / f"seed{seed}")
                     if first <= int(r["epoch"]) <= last]
                    for name in (row, "rr")
                )  # fmt: skip
                diff.append(sum(mine) / len(mine) - sum(base) / len(base))
            mean = sum(diff) / len(diff)
            sd = math.sqrt(sum((d - mean) ** 2 for d in diff) / (len(diff) - 1))
            t = mean / (sd / math.sqrt(len(diff)))
            expected.append((label, metric, first, t, t_p_two_sided(t, len(diff) - 1)))
    ps = sorted(p for *_, p in expected)
    holm_by_hand = {}
    running = 0.0
    for rank, p in enumerate(ps):
        running = max(running, min(1.0, (len(ps) - rank) * p))
        holm_by_hand[p] = running
    for label, metric, first, t, p in expected:
        window = "epoch 100" if first == 100 else "epochs 91-100 (mean)"
        got = final[(final["row"] == label) & (final["metric"] == metric)
                    & (final["window"] == window)].iloc[0]  # fmt: skip
        assert got["versus"] == "RR (functional)" and got["n"] == len(seeds)
        assert got["t"] == pytest.approx(t, rel=1e-9) and got["p"] == pytest.approx(p, rel=1e-6)
        assert got["p_holm"] == pytest.approx(holm_by_hand[p], rel=1e-6)


@pytest.mark.skipif(not RUNS.is_dir(), reason="no committed results/table1/runs")
def test_any_number_of_seeds_from_two():
    """Two seeds of the committed runs give 1-degree-of-freedom tests; a row with one seed
    only is left out of the tests."""
    from grab_exp.report import read_runs, runs_frame

    frame = runs_frame(read_runs([RUNS]))
    two = frame[frame["seed"].isin([0, 7])]
    tests = paired_tests(two, early_epoch=5)
    assert set(tests["n"]) == {2} and set(tests["df"]) == {1}
    one_row_one_seed = two[~((two["variant"] == "batch") & (two["seed"] == 7))]
    rows = set(paired_tests(one_row_one_seed, early_epoch=5)["row"])
    assert "Batch" not in rows and "Mean" in rows
    assert pd.isna(tests["p_holm"]).sum() == 0
