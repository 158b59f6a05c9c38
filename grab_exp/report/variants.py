"""The report's rows: their order, display labels and colors (one palette for every figure)."""

from __future__ import annotations

from collections.abc import Iterable

#: Table 1's rows, in the report's order, as ``(variant, pipeline)``.
ROW_ORDER: tuple[tuple[str, str], ...] = (
    ("rr", "classic"),
    ("rr", "functional"),
    ("mean", "functional"),
    ("pair", "functional"),
    ("batch", "functional"),
    ("recursive", "functional"),
    ("recursive_pair", "functional"),
)

#: The baseline every overhead is relative to: RR with the functional pipeline.
BASELINE: tuple[str, str] = ("rr", "functional")

_NAMES = {
    "rr": "RR",
    "so": "SO",
    "fixed": "Fixed",
    "mean": "Mean",
    "pair": "Pair",
    "batch": "Batch",
    "recursive": "Recursive",
    "recursive_pair": "Recursive pair",
}

#: One color per row key (see :func:`row_key`), shared by all figures (Okabe-Ito colors).
PALETTE: dict[str, str] = {
    "rr-classic": "#7f7f7f",
    "rr": "#000000",
    "mean": "#0072B2",
    "pair": "#E69F00",
    "batch": "#009E73",
    "recursive": "#D55E00",
    "recursive_pair": "#CC79A7",
}

_EXTRA_COLORS = ("#56B4E9", "#F0E442", "#8c564b", "#17becf", "#bcbd22", "#9467bd")


def row_key(variant: str, pipeline: str) -> str:
    """The row's short key, as in run directory names: ``rr``, ``rr-classic``, ``mean``..."""
    return variant if pipeline == "functional" else f"{variant}-{pipeline}"


def row_label(variant: str, pipeline: str) -> str:
    """The row's display label, e.g. ``RR (classic)``, ``RR (functional)``, ``Mean``."""
    name = _NAMES.get(variant, variant.replace("_", " ").capitalize())
    if variant == "rr" or pipeline != "functional":
        return f"{name} ({pipeline})"
    return name


def row_rank(variant: str, pipeline: str) -> tuple[int, str, str]:
    """Sort key: the report's rows first in :data:`ROW_ORDER`, any others after, by name."""
    try:
        return ROW_ORDER.index((variant, pipeline)), "", ""
    except ValueError:
        return len(ROW_ORDER), variant, pipeline


def ordered_rows(rows: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """The distinct ``(variant, pipeline)`` pairs of ``rows`` in the report's order."""
    return sorted(set(rows), key=lambda row: row_rank(*row))


def color_of(variant: str, pipeline: str) -> str:
    """The row's color: from :data:`PALETTE`, or a stable extra color for unknown rows."""
    key = row_key(variant, pipeline)
    if key in PALETTE:
        return PALETTE[key]
    return _EXTRA_COLORS[sum(map(ord, key)) % len(_EXTRA_COLORS)]


#: One line style and marker per row key, so that rows drawn on top of each other stay apart.
STYLES: dict[str, tuple[object, str]] = {
    "rr-classic": ((0, (1, 1.2)), "o"),
    "rr": ("--", "x"),
    "mean": ("-", "s"),
    "pair": ("-.", "^"),
    "batch": ((0, (5, 1.5)), "v"),
    "recursive": ("-", "D"),
    "recursive_pair": ((0, (3, 1, 1, 1, 1, 1)), "P"),
}


def line_style(variant: str, pipeline: str) -> tuple[object, str]:
    """The row's ``(linestyle, marker)``: from :data:`STYLES`, solid with dots for others."""
    return STYLES.get(row_key(variant, pipeline), ("-", "."))
