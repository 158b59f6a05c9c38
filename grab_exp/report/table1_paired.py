"""Table 1's paired comparison: per seed, each row minus RR (functional) of the same seed.

Every row of one seed starts from the same model and its first epoch visits the same
permutation, so the per-seed difference removes what the seed alone decides; with 3 seeds the
count of seeds on one side is all the sign of a difference can rest on (no test at n = 3).
"""

from __future__ import annotations

import pandas as pd

from grab_exp.report.render import to_markdown
from grab_exp.report.table1_table import BASELINE, row_label, row_rank

#: metric column -> (its name in the tables, which sign is better for the row)
METRICS = {"test/acc": ("test accuracy", 1), "train/loss": ("train loss", -1)}


def paired_differences(frame: pd.DataFrame, epochs: list[int]) -> pd.DataFrame:
    """Long table: ``row``, ``variant``, ``pipeline``, ``metric``, ``epoch``, ``seed``,
    ``value``, ``baseline`` (RR functional, same seed and epoch) and ``difference``.

    Args:
        frame: The tidy run frame (``variant``, ``pipeline``, ``seed``, ``epoch``, metrics).
        epochs: The epochs to compare at (e.g. 5 and 100); epochs a run lacks are skipped.
    """
    rows = frame[frame["epoch"].isin(epochs)]
    is_base = (rows["variant"] == BASELINE[0]) & (rows["pipeline"] == BASELINE[1])
    base = rows[is_base].set_index(["seed", "epoch"])
    out = []
    for metric in METRICS:
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
