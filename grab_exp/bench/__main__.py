"""``python -m grab_exp.bench <benchmark> [options]``; ``--help`` lists the benchmarks."""

from __future__ import annotations

import sys
from types import ModuleType

from grab_exp.bench import conv, epoch, orderings, per_sample, projection, rss, state, sweep, vrgd

#: name (the module's own) -> module; each module has ``build_parser()`` and ``main(argv)``
BENCHMARKS: dict[str, ModuleType] = {
    module.__name__.rsplit(".", 1)[-1]: module
    for module in (orderings, epoch, sweep, projection, vrgd, rss, conv, per_sample, state)
}


def usage() -> str:
    """The command's usage and every benchmark with its one-line description."""
    width = max(map(len, BENCHMARKS))
    lines = [
        "usage: python -m grab_exp.bench <benchmark> [options]",
        "",
        "Each benchmark prints a table and writes a JSON report (default: report/bench/"
        "<benchmark>.json; --out results/bench/<benchmark>.json replaces the committed one).",
        "python -m grab_exp.bench <benchmark> --help lists its options. Benchmarks:",
    ]
    for name, module in BENCHMARKS.items():
        # its parser's description: the module docstring's first line
        lines.append(f"  {name:<{width}}  {module.build_parser().description or ''}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    """Dispatch to the named benchmark; ``--help`` (or ``-h``) prints :func:`usage`, exit 0."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return
    if not argv or argv[0] not in BENCHMARKS:
        got = repr(argv[0]) if argv else "nothing"
        raise SystemExit(f"error: benchmark: got {got}; allowed: {', '.join(BENCHMARKS)}")
    BENCHMARKS[argv[0]].main(argv[1:])


if __name__ == "__main__":
    main()
