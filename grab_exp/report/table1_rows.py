"""Table 1's rows: which they are (read from ``conf/`` once), their labels, order, colors and
line styles, and the tidy frame of their runs in that order.

The rows are those that ``conf/experiment/table1.yaml`` sweeps, each ``(variant, pipeline)`` from
its ``conf/row/<row>.yaml``; a run of any other ordering still gets a row (after them, labelled
from its name).
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd
from omegaconf import OmegaConf

from grab_exp.report.collect import Record
from grab_exp.report.experiments import check_one_experiment
from grab_exp.report.frames import ID_COLUMNS
from grab_exp.runner.rundir.identity import CONF_DIR, conf_choices
from grab_exp.runner.rundir.resolvers import variant_dir


def swept(experiment: str, key: str) -> list[str]:
    """The values ``conf/experiment/<experiment>.yaml`` sweeps ``key`` over, in its order."""
    params = OmegaConf.load(CONF_DIR / "experiment" / f"{experiment}.yaml").hydra.sweeper.params
    return [value.strip() for value in str(params[key]).split(",")]


def table1_rows() -> tuple[tuple[str, str], ...]:
    """Table 1's rows as ``(variant, pipeline)``, in the order ``conf/experiment/table1.yaml``
    sweeps them, each from the ``/balance`` and ``/pipeline`` of its ``conf/row/<row>.yaml``."""
    rows = (conf_choices(f"row/{name}") for name in swept("table1", "row"))
    return tuple((chosen["balance"], chosen["pipeline"]) for chosen in rows)


#: Table 1's rows, in the report's order, as ``(variant, pipeline)`` (see :func:`table1_rows`).
ROW_ORDER = table1_rows()
#: The baseline every overhead and paired difference is relative to: RR, functional pipeline.
BASELINE: tuple[str, str] = ("rr", "functional")
#: Table 1's GraB rows: every row whose ordering is not the baseline's (RR), in the report's order.
GRAB_ROWS = tuple(row for row in ROW_ORDER if row[0] != BASELINE[0])
#: Each row's run directory name (``rr-classic``, ``rr``, ``mean``...), the key of bench files.
ROW_KEYS = tuple(variant_dir(*row) for row in ROW_ORDER)
EARLY_EPOCH = 5  # the report's "after 5 epochs" columns
#: Figure colors (Okabe-Ito) and ``(linestyle, marker)`` of the rows of :data:`ROW_ORDER`, in order;
#: other rows take a stable extra color and solid lines with dots.
COLORS = ("#7f7f7f", "#000000", "#0072B2", "#E69F00", "#009E73", "#D55E00", "#CC79A7")
EXTRA_COLORS = ("#56B4E9", "#F0E442", "#8c564b", "#17becf", "#bcbd22", "#9467bd")
STYLES = (((0, (1, 1.2)), "o"), ("--", "x"), ("-", "s"), ("-.", "^"), ((0, (5, 1.5)), "v"))
STYLES += (("-", "D"), ((0, (3, 1, 1, 1, 1, 1)), "P"))


def row_label(variant: str, pipeline: str) -> str:
    """The row's display label from its names, e.g. ``RR (classic)``, ``RR (functional)``,
    ``Recursive pair``: a part of up to two letters is an acronym; the pipeline is named when
    it is not the functional one or when the variant has rows with both."""
    words = [word.upper() if len(word) <= 2 else word for word in variant.split("_")]
    name = " ".join(words)
    name = name[:1].upper() + name[1:]
    if pipeline != "functional" or [v for v, _ in ROW_ORDER].count(variant) > 1:
        return f"{name} ({pipeline})"
    return name


def row_rank(variant: str, pipeline: str) -> tuple[int, str, str]:
    """Sort key: the report's rows first in :data:`ROW_ORDER`, any others after, by name."""
    row = (variant, pipeline)
    return (ROW_ORDER.index(row), "", "") if row in ROW_ORDER else (len(ROW_ORDER), *row)


def is_baseline(frame: pd.DataFrame) -> pd.Series:
    """Which rows of a frame with ``variant`` and ``pipeline`` columns are :data:`BASELINE`'s."""
    return (frame["variant"] == BASELINE[0]) & (frame["pipeline"] == BASELINE[1])


def color_of(variant: str, pipeline: str) -> str:
    """The row's color, one per row in every figure (see :data:`COLORS`)."""
    rank = row_rank(variant, pipeline)[0]
    if rank < len(COLORS):
        return COLORS[rank]
    return EXTRA_COLORS[sum(map(ord, variant_dir(variant, pipeline))) % len(EXTRA_COLORS)]


def line_style(variant: str, pipeline: str) -> tuple[object, str]:
    """The row's ``(linestyle, marker)``, so that rows drawn on top of each other stay apart."""
    rank = row_rank(variant, pipeline)[0]
    return STYLES[rank] if rank < len(STYLES) else ("-", ".")


def runs_frame(runs: Sequence[Record]) -> pd.DataFrame:
    """The tidy frame of Table 1's runs (records of :mod:`grab_exp.report.collect`), in the
    report's order.

    Raises:
        ValueError: the runs are not one experiment, or two share ordering and seed
            (:func:`grab_exp.report.experiments.check_one_experiment`).
    """
    frames = [run_frame for run_frame, _ in runs]
    if not frames:
        return pd.DataFrame(columns=list(ID_COLUMNS))
    check_one_experiment(runs)
    frame = pd.concat(frames, ignore_index=True)
    pairs = zip(frame["variant"], frame["pipeline"].fillna(""), strict=True)
    keyed = frame.assign(_rank=[row_rank(v, p) for v, p in pairs])
    keyed = keyed.sort_values(["_rank", "seed", "run", "epoch"], kind="stable")
    return keyed.drop(columns="_rank").reset_index(drop=True)
