"""The report: Table 1, the paper side by side, and Figures 1-2 from logged runs.

Typical use::

    frame = load_runs(["outputs/table1"])          # or frame_from_wandb("entity/project/group")
    table = build_table1(frame)                     # numbers: table.data
    make_report(frame, "report/", DEFAULT_PAPER_CSV)
    frame, identity = read_run("outputs/table1/mean/seed0")  # identity: see run_identity

Command line: ``python -m grab_exp.report {table1,vrgd,distributed} ...`` (see ``--help``),
e.g. ``python -m grab_exp.report table1 outputs/table1 --out report/``.
"""

from grab_exp.report.bench_epoch import EpochBench, read_epoch_bench
from grab_exp.report.build import Report, make_report
from grab_exp.report.collect import (
    IDENTITY_KEYS,
    find_run_dirs,
    load_run,
    load_runs,
    read_run,
    read_runs,
    run_identity,
)
from grab_exp.report.figures import figure1, figure2, save_figure
from grab_exp.report.frames import ReportWarning, RunLoadError
from grab_exp.report.paper import (
    DEFAULT_PAPER_CSV,
    default_paper_csv,
    hardware_note,
    merge_paper,
    read_paper,
    side_by_side_frame,
)
from grab_exp.report.render import display_frame, to_markdown
from grab_exp.report.table import Table1, build_table1, versus_rr
from grab_exp.report.variants import PALETTE, ROW_ORDER, color_of, row_label
from grab_exp.report.wandb_source import frame_from_api_runs, frame_from_wandb

__all__ = [
    "DEFAULT_PAPER_CSV",
    "IDENTITY_KEYS",
    "PALETTE",
    "ROW_ORDER",
    "EpochBench",
    "Report",
    "ReportWarning",
    "RunLoadError",
    "Table1",
    "build_table1",
    "color_of",
    "default_paper_csv",
    "display_frame",
    "figure1",
    "figure2",
    "find_run_dirs",
    "frame_from_api_runs",
    "frame_from_wandb",
    "hardware_note",
    "load_run",
    "load_runs",
    "make_report",
    "merge_paper",
    "read_epoch_bench",
    "read_paper",
    "read_run",
    "read_runs",
    "row_label",
    "run_identity",
    "save_figure",
    "side_by_side_frame",
    "to_markdown",
    "versus_rr",
]
