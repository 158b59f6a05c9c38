"""``python -m grab_exp.report table1 RUNS... --out DIR``: Table 1, the paper side by side and
Figures 1-2 (CSV/Markdown/LaTeX, PNG/PDF) from run directories, sweep directories, or W&B.

Writes ``table1.{csv,md,tex}`` (mean ± std over seeds), ``table1_vs_paper.{csv,md,tex}`` (next to
the published means), ``table1_paired.{csv,md}`` (per seed, each row minus RR (functional) of the
same seed, at the early and the final epoch), ``table1_tests.{csv,md}`` (the paired tests by
seed, each GraB row against RR and against each other, Holm-adjusted),
``figure1.{png,pdf}``, ``figure2.{png,pdf}``, ``figures.md`` (their captions) and ``runs.csv``
(every run's rows);
``--log-to-wandb`` uploads the tables and figures to a W&B report run.
"""

from __future__ import annotations

import argparse
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from grab_exp.report.collect import parse_wandb_path, read_runs, read_wandb_runs
from grab_exp.report.frames import ReportWarning
from grab_exp.report.render import save_figure, to_latex, to_markdown
from grab_exp.report.table1_bench import read_epoch_bench, read_training_state
from grab_exp.report.table1_figures import figure1, figure2, figure_captions
from grab_exp.report.table1_paired import paired_differences, paired_markdown, tests_markdown
from grab_exp.report.table1_paper import (
    DEFAULT_PAPER_CSV,
    merge_paper,
    paper_latex,
    paper_markdown,
    read_paper,
)
from grab_exp.report.table1_rows import EARLY_EPOCH, runs_frame
from grab_exp.report.table1_stats import paired_tests
from grab_exp.report.table1_table import Table1, build_table1
from grab_exp.report.table1_text import caption, display_frame, markdown_notes
from grab_exp.report.wandb_upload import log_report


@dataclass
class Report:
    """What :func:`compute` makes of the runs: their frame, Table 1 and the published table."""

    frame: pd.DataFrame
    table: Table1
    paper: pd.DataFrame | None  # None: not asked for, or not readable (warned)
    tests: pd.DataFrame | None = None  # None: SciPy is not installed (warned)


def add_arguments(cli: argparse.ArgumentParser) -> None:
    """The options of ``python -m grab_exp.report table1``."""
    cli.add_argument("paths", nargs="*", help="run directories or sweep directories")
    cli.add_argument("--out", required=True, type=Path, help="output folder")
    cli.add_argument("--wandb", metavar="ENTITY/PROJECT[/GROUP]", help="read runs from W&B")
    cli.add_argument("--log-to-wandb", action="store_true", help="upload to a W&B report run")
    cli.add_argument(
        "--wandb-project", help="report run's project (default: --wandb's, or grab-exp)"
    )
    cli.add_argument("--wandb-entity", help="report run's entity (default: --wandb's)")
    cli.add_argument("--wandb-group", help="report run's group (default: --wandb's)")
    cli.add_argument(
        "--wandb-mode",
        default="auto",
        choices=("auto", "online", "offline"),
        help="auto: WANDB_MODE, else online with an API key, else offline",
    )
    cli.add_argument("--log-loss", action="store_true", help="log-scale loss in Figure 1")
    cli.add_argument(
        "--early-epoch", type=int, default=EARLY_EPOCH, help="early columns' epoch (default: 5)"
    )
    cli.add_argument("--zoom-epochs", type=int, help="epochs in Figure 1's zoom panels")
    cli.add_argument("--paper", default=str(DEFAULT_PAPER_CSV), help="default: %(default)s")
    cli.add_argument("--no-paper", action="store_true", help="skip the side-by-side table")
    cli.add_argument("--hardware", help="our hardware in words, for the side-by-side note")
    cli.add_argument(
        "--bench",
        help="`python -m grab_exp.bench epoch` JSON: idle-machine times, the only source of "
        "time overheads (without it the report shows none)",
    )
    cli.add_argument(
        "--bench-method",
        help="the per-sample method the runs used where it is not --bench's default: its "
        "<row>@<method> rows stand for the per-sample rows (e.g. hooks)",
    )
    cli.add_argument(
        "--state",
        help="`python -m grab_exp.bench state` JSON: the training state's allocated bytes, "
        "the memory column and Figure 2's memory panel (without it: the runs' own peaks)",
    )


def load(args: argparse.Namespace) -> pd.DataFrame:
    """The tidy frame of the runs under ``args.paths`` and/or in W&B project ``args.wandb``.

    Raises:
        FileNotFoundError: a path does not exist.
        RuntimeError: W&B could not be read (network, credentials, unknown project).
        ValueError: a bad ``--wandb`` path, or no finished run.
    """
    runs = read_runs(args.paths)
    if args.wandb:
        try:
            runs += read_wandb_runs(args.wandb)
        except ValueError:
            raise
        except Exception as error:  # network, credentials, unknown project: W&B's own errors
            raise RuntimeError(f"cannot read runs from W&B {args.wandb}: {error}") from error
    frame = runs_frame(runs)
    if frame.empty:
        raise ValueError("no finished runs to report")
    return frame


def compute(frame: pd.DataFrame, args: argparse.Namespace) -> Report:
    """Table 1 (time overheads from ``args.bench`` only) and the published table.

    Raises:
        ValueError: ``args.bench`` is not an ``epoch`` benchmark with Table 1's rows.
    """
    bench = read_epoch_bench(args.bench, method=args.bench_method) if args.bench else None
    state = read_training_state(args.state) if args.state else None
    paper = None
    if not args.no_paper:
        try:
            paper = read_paper(args.paper)
        except (OSError, ValueError) as error:
            message = f"no side-by-side table: cannot read the paper's table {args.paper} ({error})"
            warnings.warn(message, ReportWarning, stacklevel=2)
    table = build_table1(frame, args.early_epoch, bench, state)
    return Report(frame, table, paper, _tests(frame, table.early_epoch))


def _tests(frame: pd.DataFrame, early_epoch: int) -> pd.DataFrame | None:
    """The paired tests (:func:`paired_tests`); None, warned, where SciPy is not installed."""
    try:
        return paired_tests(frame, early_epoch)
    except ImportError as error:
        warnings.warn(f"no paired tests: {error}", ReportWarning, stacklevel=3)
        return None


def write(report: Report, args: argparse.Namespace) -> list[Path]:
    """Write the files of the module docstring under ``args.out`` (created); returns them."""
    out, table = Path(args.out), report.table
    out.mkdir(parents=True, exist_ok=True)
    report.frame.to_csv(out / "runs.csv", index=False)
    written = [out / "runs.csv", *_write_table(table, out)]
    paired = paired_differences(report.frame, sorted({table.early_epoch, *table.final_epochs}))
    paired.to_csv(out / "table1_paired.csv", index=False)
    (out / "table1_paired.md").write_text(paired_markdown(paired))
    written += [out / "table1_paired.csv", out / "table1_paired.md"]
    if report.tests is not None:
        report.tests.to_csv(out / "table1_tests.csv", index=False)
        (out / "table1_tests.md").write_text(tests_markdown(report.tests))
        written += [out / "table1_tests.csv", out / "table1_tests.md"]
    if report.paper is not None:
        written += _write_side_by_side(table, report.paper, out, args.hardware)
    written += save_figure(figure1(report.frame, args.log_loss, args.zoom_epochs), out, "figure1")
    written += save_figure(figure2(table), out, "figure2")
    (out / "figures.md").write_text(figure_captions(report.frame, table))
    return [*written, out / "figures.md"]


def _write_table(table: Table1, out: Path) -> list[Path]:
    """``table1.{csv,md,tex}``: the numbers; the table with its caption and notes."""
    shown, text, notes = display_frame(table), caption(table), markdown_notes(table)
    table.data.to_csv(out / "table1.csv", index=False)
    (out / "table1.md").write_text(f"# Table 1\n\n{text}\n\n{to_markdown(shown)}\n{notes}")
    latex_notes = " ".join(line.removeprefix("- ") for line in notes.splitlines())
    (out / "table1.tex").write_text(to_latex(shown, f"{text} {latex_notes}", "tab:table1"))
    return [out / f"table1.{ext}" for ext in ("csv", "md", "tex")]


def _write_side_by_side(table: Table1, paper: pd.DataFrame, out: Path, hardware) -> list[Path]:
    """``table1_vs_paper.{csv,md,tex}``: ours and the paper's values in adjacent columns."""
    merge_paper(table, paper).to_csv(out / "table1_vs_paper.csv", index=False)
    (out / "table1_vs_paper.md").write_text(paper_markdown(table, paper, hardware))
    (out / "table1_vs_paper.tex").write_text(paper_latex(table, paper, hardware))
    return [out / f"table1_vs_paper.{ext}" for ext in ("csv", "md", "tex")]


def run(args: argparse.Namespace) -> int:
    """Load, compute and write, print the written files, upload them if asked.

    Returns:
        The exit status: 0; 2 without runs to read; 1 when the W&B upload failed.
    """
    if not args.paths and not args.wandb:
        print("error: give run/sweep directories, --wandb ENTITY/PROJECT[/GROUP], or both",
              file=sys.stderr)  # fmt: skip
        return 2
    report = compute(load(args), args)
    for path in write(report, args):
        print(path)
    if not args.log_to_wandb:
        return 0
    try:
        print(f"logged the report to W&B run {upload(report, args)}")
    except Exception as error:  # W&B's failures; the files are written already
        print(f"error: W&B upload failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0


def upload(report: Report, args: argparse.Namespace) -> str:
    """Log Table 1 (and the side by side) and both figures to a W&B report run; its id."""
    project, group, entity = "grab-exp", None, args.wandb_entity
    if args.wandb:
        entity_project, group = parse_wandb_path(args.wandb)
        entity = entity or entity_project.split("/")[0]
        project = entity_project.split("/")[1]
    tables = {"table1": report.table.data}
    if report.paper is not None:
        tables["table1_vs_paper"] = merge_paper(report.table, report.paper)
    images = {name: Path(args.out, f"{name}.png") for name in ("figure1", "figure2")}
    return log_report(
        tables,
        images,
        args.out,
        project=args.wandb_project or project,
        entity=entity,
        group=args.wandb_group or group,
        mode=args.wandb_mode,
    )
