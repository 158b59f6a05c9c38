"""The reports: Table 1 (with the paper side by side and Figures 1-2), VRGD, data-parallel.

A shared core: :mod:`~grab_exp.report.collect` (the one reader of runs, local or W&B, into
``(frame, identity)`` records), :mod:`~grab_exp.report.frames` (the tidy frame and its checks) and
:mod:`~grab_exp.report.render` (cells, Markdown/LaTeX, figure style and files). Then one module
per report, :mod:`~grab_exp.report.table1` (its parts: ``table1_rows``, ``table1_bench``,
``table1_table``, ``table1_text``, ``table1_paper``, ``table1_stats``, ``table1_paired``,
``table1_figures``),
:mod:`~grab_exp.report.vrgd` and :mod:`~grab_exp.report.distributed`, each with
``load(args)``, ``compute(frame, args)``, ``write(report, args)`` and ``run(args)``.

Table 1 from Python (what ``notebooks/reproduce_figures.ipynb`` does)::

    frame = runs_frame(read_runs(["outputs/table1"]))  # or read_wandb_runs("entity/project/group")
    table = build_table1(frame, bench=read_epoch_bench("results/bench/epoch_1t.json"))
    to_markdown(display_frame(table)); versus_rr(table)  # GraB minus RR, in means
    paired_tests(frame, early_epoch=5)  # each GraB row vs RR and each other, paired by seed
    figure1(frame); figure2(table)

Command line: ``python -m grab_exp.report {table1,vrgd,distributed} ...`` (see ``--help``),
e.g. ``python -m grab_exp.report table1 outputs/table1 --out report/``.
"""

from grab_exp.report import distributed, table1, vrgd
from grab_exp.report.collect import find_run_dirs, read_api_runs, read_runs, read_wandb_runs
from grab_exp.report.frames import ReportWarning, RunLoadError
from grab_exp.report.render import save_figure, to_markdown
from grab_exp.report.table1_bench import BenchRows, read_epoch_bench, read_training_state
from grab_exp.report.table1_figures import figure1, figure2
from grab_exp.report.table1_paper import (
    DEFAULT_PAPER_CSV,
    default_paper_csv,
    hardware_note,
    merge_paper,
    read_paper,
    side_by_side_frame,
)
from grab_exp.report.table1_rows import ROW_ORDER, color_of, row_label, runs_frame
from grab_exp.report.table1_stats import paired_tests
from grab_exp.report.table1_table import Table1, build_table1, versus_rr
from grab_exp.report.table1_text import display_frame

__all__ = [
    "DEFAULT_PAPER_CSV",
    "ROW_ORDER",
    "BenchRows",
    "ReportWarning",
    "RunLoadError",
    "Table1",
    "build_table1",
    "color_of",
    "default_paper_csv",
    "display_frame",
    "distributed",
    "figure1",
    "figure2",
    "find_run_dirs",
    "hardware_note",
    "merge_paper",
    "paired_tests",
    "read_api_runs",
    "read_epoch_bench",
    "read_paper",
    "read_runs",
    "read_training_state",
    "read_wandb_runs",
    "row_label",
    "runs_frame",
    "save_figure",
    "side_by_side_frame",
    "table1",
    "to_markdown",
    "versus_rr",
    "vrgd",
]
