#!/usr/bin/env python
"""Record the per-epoch metrics of short reference runs (synthetic data, 2 epochs, one thread).

``tests/cli/test_behaviour_unchanged.py`` runs the same commands and compares its metrics with
the file this writes, so a refactoring of the runner cannot change what a run computes. Rerun it
only when a change of results is intended, and say so in the commit:

    python scripts/record_golden_metrics.py --out tests/support/data/golden_metrics.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

#: name -> overrides of ``python -m grab_exp`` (always with experiment=smoke, 2 epochs)
CASES = {
    "mean": ["balance=mean"],
    "recursive": ["balance=recursive"],
    "rr_classic": ["balance=rr", "pipeline=classic"],
    "vr_momentum": ["balance=rr", "optimizer=vr_momentum"],
    "cd_grab_2_simulated": ["balance=cd_grab", "distributed.simulate_workers=2"],
}
BASE = [
    "experiment=smoke",
    "epochs=2",
    "progress=none",
    "device=cpu",
    "dataset.num_train=512",
    "optimizer.lr=0.02",
]
#: columns that depend on the machine and the moment, not on the computation
COMPARED = ("train/loss", "train/acc", "test/loss", "test/acc", "train/running_loss")


def run_case(overrides: list[str], root: Path) -> list[dict[str, float]]:
    """Run one case in ``root``; its metrics.csv rows (compared columns only)."""
    run_dir = root / "run"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "HYDRA_FULL_ERROR": "1"}
    command = [sys.executable, "-m", "grab_exp", *BASE, *overrides, f"hydra.run.dir={run_dir}"]
    subprocess.run(command, cwd=root, env=env, check=True)
    with open(run_dir / "metrics.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    return [{"epoch": int(r["epoch"]), **{k: float(r[k]) for k in COMPARED}} for r in rows]


def main() -> None:
    """Run every case and write the JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/support/data/golden_metrics.json"))
    args = parser.parse_args()
    golden = {"base": BASE, "cases": {}}
    for name, overrides in CASES.items():
        with tempfile.TemporaryDirectory() as root:
            golden["cases"][name] = {
                "overrides": overrides,
                "rows": run_case(overrides, Path(root)),
            }
    args.out.write_text(json.dumps(golden, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
