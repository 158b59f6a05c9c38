"""Write every report output for a tidy run frame: tables, side by side, figures."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from grab_exp.report.bench_epoch import EpochBench
from grab_exp.report.figures import figure1, figure2, save_figure
from grab_exp.report.frames import ReportWarning
from grab_exp.report.paper import hardware_note, merge_paper, read_paper, side_by_side_frame
from grab_exp.report.render import caption, display_frame, to_latex, to_markdown
from grab_exp.report.table import EARLY_EPOCH, Table1, build_table1


@dataclass
class Report:
    """What :func:`make_report` computed and wrote.

    Attributes:
        table: Table 1.
        paper: The published table (``None`` when not read).
        files: Output kind (``runs``, ``table1``, ``table1_vs_paper``, ``figure1``,
            ``figure2``) -> written paths (CSV/Markdown/LaTeX, PNG/PDF).
    """

    table: Table1
    paper: pd.DataFrame | None
    files: dict[str, list[Path]] = field(default_factory=dict)


def write_table1(table: Table1, out: Path) -> list[Path]:
    """``table1.csv`` (numbers), ``table1.md`` and ``table1.tex`` (mean ± std cells)."""
    shown, text = display_frame(table), caption(table)
    table.data.to_csv(out / "table1.csv", index=False)
    (out / "table1.md").write_text(f"# Table 1\n\n{text}\n\n{to_markdown(shown)}")
    (out / "table1.tex").write_text(to_latex(shown, text, "tab:table1"))
    return [out / "table1.csv", out / "table1.md", out / "table1.tex"]


def write_side_by_side(
    table: Table1, paper: pd.DataFrame, out: Path, hardware: str | None = None
) -> list[Path]:
    """``table1_vs_paper.{csv,md,tex}``: ours and the paper's values in adjacent columns."""
    shown, note = side_by_side_frame(table, paper), hardware_note(table, hardware)
    merge_paper(table, paper).to_csv(out / "table1_vs_paper.csv", index=False)
    title = "Table 1: ours (mean ± std over seeds) next to the paper (means)"
    (out / "table1_vs_paper.md").write_text(
        f"# {title}\n\n{to_markdown(shown)}\n## Setup differences\n\n{note}"
    )
    latex_note = " ".join(line.removeprefix("- ") for line in note.splitlines())
    (out / "table1_vs_paper.tex").write_text(to_latex(shown, f"{title}. {latex_note}", "tab:vs"))
    return [out / f"table1_vs_paper.{ext}" for ext in ("csv", "md", "tex")]


def load_paper_or_warn(paper_csv: str | os.PathLike[str] | None) -> pd.DataFrame | None:
    """The published table, or ``None`` (with a warning) when the file is missing/invalid."""
    if paper_csv is None:
        return None
    try:
        return read_paper(paper_csv)
    except (OSError, ValueError) as error:
        warnings.warn(
            f"no side-by-side table: cannot read the paper's table {paper_csv} ({error})",
            ReportWarning,
            stacklevel=2,
        )
        return None


def make_report(
    frame: pd.DataFrame,
    out_dir: str | os.PathLike[str],
    paper_csv: str | os.PathLike[str] | None = None,
    log_loss: bool = False,
    early_epoch: int = EARLY_EPOCH,
    zoom_epochs: int | None = None,
    hardware: str | None = None,
    bench: EpochBench | None = None,
) -> Report:
    """Write Table 1, the side-by-side table, Figures 1 and 2 and ``runs.csv`` to ``out_dir``.

    Args:
        frame: The tidy run frame (local runs or W&B).
        out_dir: Output folder (created).
        paper_csv: The published ``paper_table1.csv``; ``None`` skips the side-by-side table.
        log_loss: Log-scale loss axis in Figure 1.
        early_epoch: Epoch of Table 1's early columns (lowered for shorter runs).
        zoom_epochs: Epochs in Figure 1's zoom panels (default: automatic).
        hardware: Free text describing our hardware, for the side-by-side note.
        bench: Idle-machine step times, the only source of time overheads (Figure 2 too).

    Returns:
        The :class:`Report`: Table 1, the paper's table, the written files.

    Raises:
        ValueError: ``frame`` holds no runs.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    table = build_table1(frame, early_epoch, bench)
    frame.to_csv(out / "runs.csv", index=False)
    written = {"runs": [out / "runs.csv"], "table1": write_table1(table, out)}
    paper = load_paper_or_warn(paper_csv)
    if paper is not None:
        written["table1_vs_paper"] = write_side_by_side(table, paper, out, hardware)
    written["figure1"] = save_figure(figure1(frame, log_loss, zoom_epochs), out, "figure1")
    written["figure2"] = save_figure(figure2(table), out, "figure2")
    return Report(table, paper, written)
