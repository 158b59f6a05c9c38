"""Table of a distributed sweep: train loss per epoch (mean ± std over seeds) per ordering.

Usage: python scripts/distributed_table.py outputs/distributed --out results/distributed
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from grab_exp.report.render import to_markdown

ORDER = ("cd_grab", "d_grab", "d_rr")


def load(sweep: Path) -> pd.DataFrame:
    """One row per (variant, seed, epoch) of every finished run under ``sweep``."""
    frames = []
    for summary_path in sorted(sweep.rglob("summary.json")):
        summary = json.loads(summary_path.read_text())
        if summary.get("status") != "finished":
            print(f"warning: skipping unfinished run {summary_path.parent}")
            continue
        metrics = pd.read_csv(summary_path.parent / "metrics.csv")
        frames.append(metrics.assign(variant=summary["variant"], seed=summary["seed"]))
    return pd.concat(frames, ignore_index=True)


def table(frame: pd.DataFrame, epochs: list[int]) -> pd.DataFrame:
    """Mean ± std over seeds of train loss at ``epochs`` and of the final test accuracy."""
    last = frame["epoch"].max()
    rows = []
    for variant in [v for v in ORDER if v in set(frame["variant"])]:
        runs = frame[frame["variant"] == variant]
        row = {"ordering": variant, "seeds": runs["seed"].nunique()}
        for epoch in epochs:
            values = runs[runs["epoch"] == epoch]["train/loss"]
            row[f"train loss ep. {epoch}"] = f"{values.mean():.4f} ± {values.std():.4f}"
        acc = runs[runs["epoch"] == last]["test/acc"]
        row[f"test acc. ep. {last}"] = f"{acc.mean():.4f} ± {acc.std():.4f}"
        rows.append(row)
    return pd.DataFrame(rows)


def paired(frame: pd.DataFrame, baseline: str = "d_rr") -> pd.DataFrame:
    """Per-seed final train-loss difference of each ordering to ``baseline``."""
    last = frame[frame["epoch"] == frame["epoch"].max()].pivot(
        index="seed", columns="variant", values="train/loss"
    )
    return last.sub(last[baseline], axis=0).drop(columns=baseline).round(4)


def main() -> None:
    """Write table.csv, table.md and per_epoch.csv to ``--out``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("sweep", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    frame = load(args.sweep)
    last = int(frame["epoch"].max())
    shown = table(frame, sorted({1, 2, 5, last}))
    diffs = paired(frame)
    args.out.mkdir(parents=True, exist_ok=True)
    shown.to_csv(args.out / "table.csv", index=False)
    frame.to_csv(args.out / "per_epoch.csv", index=False)
    text = to_markdown(shown) + "\nFinal train loss minus d_rr's, per seed:\n\n"
    (args.out / "table.md").write_text(text + to_markdown(diffs.reset_index()))
    print((args.out / "table.md").read_text())


if __name__ == "__main__":
    main()
