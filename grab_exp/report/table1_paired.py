"""Table 1, paired by seed: per seed, each row minus RR (functional) of the same seed
(``table1_paired.{csv,md}``), and the paired tests of :mod:`~grab_exp.report.table1_stats` as
text (``table1_tests.md``).

Every row of one seed starts from the same model and its first epoch visits the same
permutation, so the per-seed difference removes what the seed alone decides.
"""

from __future__ import annotations

import math

import pandas as pd

from grab_exp.report.render import to_markdown
from grab_exp.report.table1_rows import BASELINE, is_baseline, row_label, row_rank
from grab_exp.report.table1_stats import METRICS as TESTED

#: metric column -> (its name in the tables, which sign is better for the row); the running
#: loss (the mean of the epoch's step losses) where the runs logged it
METRICS = {
    "test/acc": ("test accuracy", 1),
    "train/loss": ("train loss (full pass after the epoch)", -1),
    "train/running_loss": ("running train loss (mean of the epoch's step losses)", -1),
}


def paired_differences(frame: pd.DataFrame, epochs: list[int]) -> pd.DataFrame:
    """Long table: ``row``, ``variant``, ``pipeline``, ``metric``, ``epoch``, ``seed``,
    ``value``, ``baseline`` (RR functional, same seed and epoch) and ``difference``.

    Args:
        frame: The tidy run frame (``variant``, ``pipeline``, ``seed``, ``epoch``, metrics).
        epochs: The epochs to compare at (e.g. 5 and 100); epochs a run lacks are skipped.
    """
    rows = frame[frame["epoch"].isin(epochs)]
    is_base = is_baseline(rows)
    base = rows[is_base].set_index(["seed", "epoch"])
    out = []
    for metric in (m for m in METRICS if m in frame):
        for (variant, pipeline, seed, epoch), value in rows[~is_base].groupby(
            ["variant", "pipeline", "seed", "epoch"]
        )[metric]:
            if (seed, epoch) not in base.index:
                continue  # no baseline run of this seed yet
            reference = float(base.loc[(seed, epoch), metric])
            out.append(
                {
                    "row": row_label(variant, pipeline),
                    "variant": variant,
                    "pipeline": pipeline,
                    "metric": metric,
                    "epoch": int(epoch),
                    "seed": int(seed),
                    "value": float(value.iloc[0]),
                    "baseline": reference,
                    "difference": float(value.iloc[0]) - reference,
                }
            )
    table = pd.DataFrame(out)
    if table.empty:
        return table
    rank = table.apply(lambda r: row_rank(r["variant"], r["pipeline"]), axis=1)
    order = sorted(range(len(table)), key=lambda i: (table["metric"].iloc[i], rank.iloc[i]))
    return table.iloc[order].reset_index(drop=True)


def paired_markdown(table: pd.DataFrame) -> str:
    """One Markdown table per metric and epoch: rows x seeds, the mean difference, and in how
    many seeds the row is on the better side."""
    if table.empty:
        return "No paired comparison: no RR (functional) run shares a seed with another row.\n"
    parts = [f"# Table 1, paired by seed: each row minus {row_label(*BASELINE)}, same seed\n"]
    for metric, (name, sign) in METRICS.items():
        for epoch in sorted(table["epoch"].unique()):
            part = table[(table["metric"] == metric) & (table["epoch"] == epoch)]
            if part.empty:
                continue
            wide = part.pivot_table(index="row", columns="seed", values="difference", sort=False)
            shown = wide.map(lambda v: "n/a" if pd.isna(v) else f"{v:+.4f}")  # n/a: no such run
            shown.columns = [f"seed {s}" for s in wide.columns]
            shown["mean"] = wide.mean(axis=1).map(lambda v: f"{v:+.4f}")
            better = (wide * sign > 0).sum(axis=1)
            shown["better in"] = [
                f"{b} of {n}" for b, n in zip(better, wide.count(axis=1), strict=True)
            ]
            parts.append(f"## {name}, epoch {epoch}\n\n{to_markdown(shown.reset_index())}")
    return "\n".join(parts)


def tests_markdown(tests: pd.DataFrame) -> str:
    """``table1_tests.md``: what the tests are, then one table per family of
    :func:`grab_exp.report.table1_stats.paired_tests`, with its size and Holm's adjustment."""
    if tests.empty:
        return "No paired test: no two rows share 2 or more seeds.\n"
    seeds = sorted(set(tests["n"]))
    floor = ", ".join(f"{2 / 2**n:.3g} at {n} seeds" for n in seeds)
    parts = [
        "# Table 1, paired tests by seed\n",
        "Each test compares two rows seed by seed (each seed's pair of runs shares the model's "
        "initialization and the first epoch's order): the two-sided paired t-test "
        "(scipy.stats.ttest_rel, n - 1 degrees of freedom) of the first row minus the second, "
        "on one epoch or on each run's mean over the window's epochs. Holm p: Holm's step-down "
        "adjustment over every test of the family (its size in the heading), valid whatever "
        "their dependence; the GraB rows of one seed are all compared with the same RR run, so "
        "they are dependent. Better in: the seeds on which the first row has the lower loss or "
        "the higher accuracy. 95% CI: the t-interval of the mean difference (n - 1 degrees of "
        "freedom); from 3 seeds its width rests on 3 differences and moves a lot with any one "
        "of them. Signed-rank p: the exact two-sided Wilcoxon signed-rank test, "
        f"whose smallest possible p is {floor}: with so few seeds it can only show that the "
        "signs disagree, never a significant difference. Differences of accuracy are fractions "
        "(0.01 = 1 point). n/a: no p-value, where the differences are equal on every seed (no "
        "spread: a t-test is undefined) or one is zero (signed-rank), or Holm's adjustment of "
        "one.\n",
    ]
    for family, part in tests.groupby("family", sort=False):
        windows = " and ".join(dict.fromkeys(part["window"]))
        parts.append(f"## {family}: {windows}; Holm over {len(part)} tests\n")
        parts.append(to_markdown(_tests_frame(part)))
    return "\n".join(parts)


def _tests_frame(part: pd.DataFrame) -> pd.DataFrame:
    names = {metric: name for metric, (name, _) in TESTED.items()}
    return pd.DataFrame(
        {
            "Window": part["window"],
            "Metric": part["metric"].map(names),
            "Difference": [
                f"{r} minus {v}" for r, v in zip(part["row"], part["versus"], strict=True)
            ],
            "Mean diff.": part["mean_difference"].map(lambda v: f"{v:+.4f}"),
            "95% CI": [
                _interval(low, high)
                for low, high in zip(part["ci95_low"], part["ci95_high"], strict=True)
            ],
            "t": part["t"].map(lambda v: "n/a" if math.isnan(v) else f"{v:.2f}"),
            "df": part["df"].astype(str),
            "p": part["p"].map(_p),
            "Holm p": part["p_holm"].map(_p),
            "Better in": [f"{b} of {n}" for b, n in zip(part["better"], part["n"], strict=True)],
            "Signed-rank p": part["signed_rank_p"].map(_p),
        }
    )


def _interval(low: float, high: float) -> str:
    """``[-0.0053, +0.0759]``; ``n/a`` without one."""
    return "n/a" if math.isnan(low) else f"[{low:+.4f}, {high:+.4f}]"


def _p(value: float) -> str:
    """A p-value at 4 decimals (``<0.0001`` below); ``n/a`` when undefined."""
    if math.isnan(value):
        return "n/a"
    return "<0.0001" if value < 0.0001 else f"{value:.4f}"
