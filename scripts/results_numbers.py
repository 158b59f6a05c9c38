#!/usr/bin/env python
"""Recompute, from the committed raw runs and bench files, every number that
``results/README.md``, ``results/vrgd/README.md`` and ``results/bench/README.md`` quote.

Run from the repository root: ``python scripts/results_numbers.py``. Comparisons of two arms
are paired by seed; with 3 seeds a paired t-test has 2 degrees of freedom.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

RESULTS = Path("results")
GRAB = ["mean", "pair", "batch", "recursive", "recursive_pair"]


def paired_p(a: pd.Series, b: pd.Series) -> float:
    """Two-sided paired t-test p-value for 3 pairs (t with 2 degrees of freedom, closed form)."""
    diff = (a - b).to_numpy()
    assert len(diff) == 3, "closed form for 2 degrees of freedom"
    sd = diff.std(ddof=1)
    if sd == 0:
        return 0.0 if diff.mean() != 0 else 1.0
    t = diff.mean() / (sd / math.sqrt(3))
    return 1 - abs(t) / math.sqrt(2 + t * t)


def variance_ratio_p(f: float) -> float:
    """Two-sided p of a variance ratio F with (2, 2) degrees of freedom (CDF x / (1 + x))."""
    return 2 * min(f / (1 + f), 1 / (1 + f))


def table1() -> None:
    runs = pd.read_csv(RESULTS / "table1" / "runs.csv")
    runs["row"] = runs["variant"] + runs["pipeline"].map({"classic": "-classic", "functional": ""})
    first = runs[runs["epoch"] == 1].groupby("seed")[["train/loss", "test/acc"]].nunique()
    print("epoch 1: distinct values across the 7 rows, per seed\n", first)
    last = runs[runs["epoch"] == runs["epoch"].max()].pivot(index="seed", columns="row")
    loss, acc = last["train/loss"], last["test/acc"]
    print("seeds:", list(loss.index))
    d_loss = loss[GRAB].sub(loss["rr"], axis=0)
    d_acc = 100 * acc[GRAB].sub(acc["rr"], axis=0)
    print("GraB - RR per seed, train loss\n", d_loss.round(3))
    print("GraB - RR per seed, test acc (points)\n", d_acc.round(2))
    print(
        "comparisons where GraB beats RR on both:",
        int(((d_loss < 0) & (d_acc > 0)).sum().sum()),
        "of",
        d_loss.size,
    )
    print("rank of each GraB row per seed (1 = best), loss\n", loss[GRAB].rank(axis=1))
    print("rank per seed, accuracy\n", acc[GRAB].rank(axis=1, ascending=False))
    for a, b in [
        ("recursive", "mean"),
        ("recursive", "pair"),
        ("recursive", "batch"),
        ("recursive_pair", "mean"),
        ("mean", "batch"),
        ("pair", "batch"),
    ]:
        for name, frame in (("loss", loss), ("acc", acc)):
            diff = frame[a] - frame[b]
            p = paired_p(frame[a], frame[b])
            print(f"{a} - {b} {name}: per seed {diff.round(4).tolist()} paired t p={p:.2f}")
    paper = pd.read_csv(RESULTS / "paper_table1.csv")
    mean = last[["train/loss", "test/acc"]].mean()
    for _, row in paper.iterrows():
        key = row["variant"] + ("-classic" if row["pipeline"] == "classic" else "")
        gap_loss = mean["train/loss"][key] - row["train_loss_epoch5"]
        gap_acc = 100 * (mean["test/acc"][key] - row["test_acc_epoch5"])
        print(f"{key}: ours - paper at ep. 5: loss {gap_loss:+.3f} acc {gap_acc:+.2f} points")


def vrgd() -> None:
    runs = pd.read_csv(RESULTS / "vrgd" / "vrgd_runs.csv")
    acc = runs.pivot_table(index=["batch_size", "seed"], columns="arm", values="final_test_acc")
    for vr, plain in (("vr_momentum", "sgd_momentum"), ("vr_adam", "adam")):
        for batch, part in acc.groupby(level=0):
            diff = 100 * (part[vr] - part[plain])
            p = paired_p(part[vr], part[plain])
            print(
                f"{vr} - {plain} @ {batch}: per seed {diff.round(2).tolist()} "
                f"mean {diff.mean():+.2f} points, paired t p={p:.2f}"
            )
    a = acc.loc[4096]
    va, vb = a["adam"].var(ddof=1), a["vr_adam"].var(ddof=1)
    f = va / vb
    p = variance_ratio_p(f)
    print(
        f"4096 final acc Adam {(100 * a['adam']).round(2).tolist()}, "
        f"VR-Adam {(100 * a['vr_adam']).round(2).tolist()}; F={f:.2f} two-sided p={p:.2f}"
    )
    print("steps per epoch:", {b: math.ceil(50_000 / b) for b in (256, 1024, 4096)})
    bench = pd.DataFrame(json.loads((RESULTS / "bench" / "vrgd.json").read_text())["rows"])
    times = bench.pivot(index="batch_size", columns="arm", values="step_ms")
    print("VR step / own plain step (idle bench):")
    print(
        (times["vr_momentum"] / times["sgd_momentum"]).round(2).to_dict(),
        (times["vr_adam"] / times["adam"]).round(2).to_dict(),
    )
    print(
        "GSNR ms per step:",
        bench.dropna(subset=["gsnr_ms"])
        .set_index(["arm", "batch_size"])["gsnr_ms"]
        .round(1)
        .to_dict(),
    )
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


if __name__ == "__main__":
    table1()
    vrgd()
