"""Run a range of seeds and print every failure and the summary:
``PYTHONPATH=tests/per_sample python -m fuzz.run --cases 2000 [--start 0] [--shrink]``;
one case: ``--seed 17 [--off feature,feature]``."""

from __future__ import annotations

import argparse

from .case import draw_case
from .oracle import PASSING, run_case, shrink
from .report import failure_classes, feature_rates, table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m fuzz.run")
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--cases", type=int, default=300)
    parser.add_argument("--seed", type=int, default=None, help="run this one seed only")
    parser.add_argument("--off", default="", help="features to turn off, comma-separated")
    parser.add_argument("--shrink", action="store_true", help="shrink each failure's features")
    args = parser.parse_args(argv)
    off = frozenset(f for f in args.off.split(",") if f)
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.cases)
    results = []
    for seed in seeds:
        case = draw_case(seed, off)
        outcome = run_case(case)
        results.append((case, outcome))
        if outcome.kind not in PASSING or args.seed is not None:
            print(f"seed {seed} [{case.family} {case.method}] {outcome.kind} at call "
                  f"{outcome.call}: {outcome.detail}", flush=True)  # fmt: skip
            needs = shrink(case, outcome) if args.shrink else case.features
            print(f"    features: {' '.join(sorted(needs))}", flush=True)
    print(table(results))
    print(failure_classes(results))
    print(feature_rates(results))


if __name__ == "__main__":
    main()
