"""One experiment per report: runs whose settings differ beyond their variant and seed are
refused, naming the settings, and so are two runs of one variant and seed.

Table 1 and its tests compare rows seed by seed, so every run must be the same experiment but
for its ordering (``balance``, ``pipeline``, Table 1's ``row``) and its seed. Two sources say
what a run was: its identity (:mod:`grab_exp.runner.rundir.identity`: experiment, optimizer,
batch size, workers, the hash of other overrides), which every run has, and, for runs written
since it existed, the flat resolved config of its ``summary.json`` (``config_fingerprint``),
which names the setting itself (``model._target_``, ``loss.gamma``...). Settings under
``balance.`` and ``pipeline.`` belong to the ordering: they may differ between orderings, not
between two runs of one ordering. A key only one run's config has came from a change of the
code between them, not from the user, and is not compared (as
:mod:`grab_exp.runner.config.fingerprint` does when a run resumes).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from grab_exp.report.collect import Record

#: identity keys that say which ordering and seed a run is (every other one must agree)
ORDERING_KEYS = ("variant", "pipeline", "row", "seed")
#: config keys that belong to the ordering (they may differ between orderings)
ORDERING_PREFIXES = ("balance.", "pipeline.")
#: settings named in the refusal, at most (the rest counted)
NAMED = 3


def check_one_experiment(records: Sequence[Record]) -> None:
    """Refuse runs that are not one experiment (see the module docstring).

    Args:
        records: Runs from :mod:`grab_exp.report.collect`.

    Raises:
        ValueError: one line naming the settings that differ, a run with each value and how to
            select one experiment; or naming two runs of one ordering and seed.
    """
    runs = [_settings(frame, identity) for frame, identity in records]
    differing = _differing(runs)
    if differing:
        shown = "; ".join(_values(group, key) for key, group in differing[:NAMED])
        more = f" and {len(differing) - NAMED} more" if len(differing) > NAMED else ""
        raise ValueError(
            f"the runs are not one experiment: they differ beyond variant and seed in {shown}"
            f"{more}; report one experiment at a time (pass only its sweep's or runs' folders)"
        )
    seen: dict[tuple, str] = {}
    for name, ordering, _ in runs:
        if ordering in seen:
            variant, pipeline, _, seed = ordering
            raise ValueError(
                f"two runs of {variant}/{pipeline} seed {seed} with the same settings: "
                f"{seen[ordering]} and {name}; pass only one of them"
            )
        seen[ordering] = name


def _settings(frame, identity: dict[str, Any]) -> tuple[str, tuple, dict[str, Any]]:
    """``(run, (variant, pipeline, row, seed), settings)`` of one record: its identity's other
    keys as ``identity.<key>`` and its config's keys (local runs with a fingerprint)."""
    name = str(frame["run"].iloc[0]) if len(frame) else "?"
    ordering = tuple(identity.get(key) for key in ORDERING_KEYS)
    settings = {f"identity.{k}": v for k, v in identity.items() if k not in ORDERING_KEYS}
    settings.update(_config(name))
    return name, ordering, settings


def _config(run: str) -> dict[str, Any]:
    """The flat resolved config in ``run``'s ``summary.json`` (``{}`` without one: a W&B run or
    a run written before configs were recorded)."""
    path = Path(run, "summary.json")
    try:
        summary = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError):
        return {}  # collect read it moments ago; a run changed since is not ours to judge
    fingerprint = summary.get("config_fingerprint") if isinstance(summary, dict) else None
    config = fingerprint.get("config") if isinstance(fingerprint, dict) else None
    if not isinstance(config, dict):
        return {}
    return {f"config.{k}": v for k, v in config.items() if k != "seed"}


def _differing(runs: Sequence[tuple[str, tuple, dict[str, Any]]]) -> list[tuple[str, list]]:
    """``(setting, the runs it differs in)`` of every setting with two values among runs that
    both have it: any setting between any runs, an ordering's own (``config.balance.*``,
    ``config.pipeline.*``) between runs of one ordering."""
    keys = sorted({key for _, _, settings in runs for key in settings})
    differing = []
    for key in keys:
        own = key.removeprefix("config.").startswith(ORDERING_PREFIXES)
        groups = _by_ordering(runs) if own else [list(runs)]
        differing += [(key, group) for group in groups if len(_distinct(group, key)) > 1][:1]
    return differing


def _by_ordering(runs: Iterable[tuple[str, tuple, dict]]) -> list[list[tuple[str, tuple, dict]]]:
    groups: dict[tuple, list] = {}
    for run in runs:
        groups.setdefault(run[1][:2], []).append(run)
    return list(groups.values())


def _distinct(runs: Iterable[tuple[str, tuple, dict]], key: str) -> dict[str, str]:
    """``repr(value) -> first run with it`` over the runs that have ``key``."""
    values: dict[str, str] = {}
    for name, _, settings in runs:
        if key in settings:
            values.setdefault(repr(settings[key]), name)
    return values


def _values(runs: Sequence[tuple[str, tuple, dict]], key: str) -> str:
    """``key (value in run, other value in other run)``."""
    pairs = ", ".join(f"{value} in {name}" for value, name in _distinct(runs, key).items())
    return f"{key.split('.', 1)[1]} ({pairs})"
