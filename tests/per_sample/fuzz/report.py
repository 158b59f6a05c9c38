"""The summary of a run of cases: outcome counts per method, failure classes (messages with their
numbers and names masked) and the features most often present in each failing outcome."""

from __future__ import annotations

import re
from collections import Counter

from .case import METHODS, Case
from .oracle import OUTCOMES, PASSING, Outcome


def signature(outcome: Outcome) -> str:
    """The outcome's message with numbers, shapes and quoted names masked (its class)."""
    text = re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", outcome.detail)
    text = re.sub(r"\b[\w.]+\.(weight|bias|original)\b", "<param>", text)
    return f"{outcome.kind}: {text[:140]}"


def table(results: list[tuple[Case, Outcome]]) -> str:
    """Counts of each outcome per method, and in total."""
    counts = Counter((case.method, outcome.kind) for case, outcome in results)
    lines = [f"{'method':<10}" + "".join(f"{k:>15}" for k in OUTCOMES) + f"{'cases':>8}"]
    for method in [*METHODS, "all"]:
        row = [
            sum(n for (m, k), n in counts.items() if k == kind and method in (m, "all"))
            for kind in OUTCOMES
        ]
        lines.append(f"{method:<10}" + "".join(f"{n:>15}" for n in row) + f"{sum(row):>8}")
    return "\n".join(lines)


def failure_classes(results: list[tuple[Case, Outcome]], top: int = 25) -> str:
    """The failing outcomes grouped by :func:`signature`: count and up to 5 seeds each."""
    seeds: dict[str, list[int]] = {}
    for case, outcome in results:
        if outcome.kind not in PASSING:
            seeds.setdefault(signature(outcome), []).append(case.seed)
    ranked = sorted(seeds.items(), key=lambda item: -len(item[1]))[:top]
    return "\n".join(f"{len(s):>5}  {sig}  seeds {s[:5]}" for sig, s in ranked)


def feature_rates(results: list[tuple[Case, Outcome]], top: int = 12) -> str:
    """Per failing outcome: the features with the highest failure rate among cases having them
    (``failures with it / cases with it``, at least 3 cases)."""
    having = Counter(f for case, _ in results for f in set(case.features))
    lines = []
    for kind in OUTCOMES:
        if kind in PASSING:
            continue
        failing = Counter(f for c, o in results if o.kind == kind for f in set(c.features))
        rates = sorted(
            ((n / having[f], f, n) for f, n in failing.items() if having[f] >= 3), reverse=True
        )[:top]
        if rates:
            lines.append(f"{kind}: " + ", ".join(f"{f} {n}/{having[f]}" for _, f, n in rates))
    return "\n".join(lines)
