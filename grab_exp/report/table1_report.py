"""``python -m grab_exp.report table1 RUNS... --out DIR``: Table 1, the paper side by side
and Figures 1-2 (CSV/Markdown/LaTeX, PNG/PDF) from run directories, sweep directories, or W&B.
"""

from __future__ import annotations

import argparse
import sys

import pandas as pd

from grab_exp.report.bench_epoch import read_epoch_bench
from grab_exp.report.build import Report, make_report
from grab_exp.report.collect import load_runs
from grab_exp.report.frames import concat_runs, drop_duplicate_runs
from grab_exp.report.paper import DEFAULT_PAPER_CSV, merge_paper
from grab_exp.report.table import EARLY_EPOCH
from grab_exp.report.wandb_source import frame_from_wandb, parse_wandb_path


def add_arguments(cli: argparse.ArgumentParser) -> None:
    """The options of ``python -m grab_exp.report table1``."""
    cli.add_argument("paths", nargs="*", help="run directories or sweep directories")
    cli.add_argument("--out", required=True, help="output folder")
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


def load_frame(args: argparse.Namespace) -> pd.DataFrame:
    """The tidy frame of the local paths and/or the W&B project of ``args``."""
    frames = []
    if args.paths:
        frames.append(load_runs(args.paths))
    if args.wandb:
        try:
            frames.append(frame_from_wandb(args.wandb))
        except ValueError:
            raise
        except Exception as error:  # network, credentials, unknown project: W&B's own errors
            raise RuntimeError(f"cannot read runs from W&B {args.wandb}: {error}") from error
    frames = [frame for frame in frames if not frame.empty]
    return drop_duplicate_runs(concat_runs(frames))


def upload(args: argparse.Namespace, report: Report) -> str:
    """Log Table 1 (and the side by side) and both figures to a W&B report run."""
    from grab_exp.report.wandb_upload import log_report

    project, group = "grab-exp", None
    if args.wandb:
        entity_project, group = parse_wandb_path(args.wandb)
        args.wandb_entity = args.wandb_entity or entity_project.split("/")[0]
        project = entity_project.split("/")[1]
    tables = {"table1": report.table.data}
    if report.paper is not None:
        tables["table1_vs_paper"] = merge_paper(report.table, report.paper)
    images = {name: report.files[name][0] for name in ("figure1", "figure2")}
    return log_report(
        tables,
        images,
        args.out,
        project=args.wandb_project or project,
        entity=args.wandb_entity,
        group=args.wandb_group or group,
        mode=args.wandb_mode,
    )


def run(args: argparse.Namespace) -> int:
    """Collect the runs, write the report, upload it if asked; print what was written.

    Returns:
        The exit status: 0; 2 without runs to read; 1 when no run is usable or W&B failed.
    """
    if not args.paths and not args.wandb:
        print("error: give run/sweep directories, --wandb ENTITY/PROJECT[/GROUP], or both",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        frame = load_frame(args)
        bench = read_epoch_bench(args.bench) if args.bench else None
    except (FileNotFoundError, ValueError, RuntimeError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    if frame.empty:
        print("error: no finished runs to report", file=sys.stderr)
        return 1
    paper = None if args.no_paper else args.paper
    report = make_report(
        frame, args.out, paper, args.log_loss, args.early_epoch, args.zoom_epochs, args.hardware,
        bench,
    )  # fmt: skip
    for kind, paths in report.files.items():
        print(f"{kind}: {', '.join(str(path) for path in paths)}")
    if not args.log_to_wandb:
        return 0
    try:
        print(f"logged the report to W&B run {upload(args, report)}")
    except Exception as error:  # W&B's failures; the files are written already
        print(f"error: W&B upload failed: {type(error).__name__}: {error}", file=sys.stderr)
        return 1
    return 0
