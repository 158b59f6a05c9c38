"""``python -m grab_exp.bench <benchmark> [options]``."""

from __future__ import annotations

import sys

from grab_exp.bench import conv, epoch, projection, rss, sorters, sweep, vrgd

BENCHMARKS = {
    "sorters": sorters.main,
    "epoch": epoch.main,
    "sweep": sweep.main,
    "projection": projection.main,
    "vrgd": vrgd.main,
    "rss": rss.main,
    "conv": conv.main,
}


def main() -> None:
    """Dispatch to the named benchmark."""
    if len(sys.argv) < 2 or sys.argv[1] not in BENCHMARKS:
        raise SystemExit(f"usage: python -m grab_exp.bench {{{','.join(BENCHMARKS)}}} [options]")
    BENCHMARKS[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
