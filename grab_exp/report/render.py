"""What every report shares to show its numbers: cells, Markdown and LaTeX tables, and the style
and file formats of its figures (a paper column: 3.4 in wide, 7 pt text; PNG and PDF)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import matplotlib as mpl
import pandas as pd
from matplotlib.ticker import MaxNLocator, NullLocator, ScalarFormatter

COLUMN_WIDTH_IN = 3.4
STYLE = {
    "font.size": 7,
    "axes.titlesize": 7,
    "axes.labelsize": 7,
    "xtick.labelsize": 6,
    "ytick.labelsize": 6,
    "legend.fontsize": 6,
    "axes.linewidth": 0.6,
    "lines.linewidth": 1.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.formatter.useoffset": False,
}
DPI = 300


def cell(mean: float, std: float, places: int) -> str:
    """``mean ± std`` (just ``mean`` when std is undefined; ``—`` when mean is missing)."""
    if mean is None or math.isnan(mean):
        return "—"
    if std is None or math.isnan(std):
        return f"{mean:.{places}f}"
    return f"{mean:.{places}f} ± {std:.{places}f}"


def percent(value: float) -> str:
    """Signed percentage, e.g. ``+12.3%``; ``—`` when missing."""
    return "—" if value is None or math.isnan(value) else f"{value:+.1f}%"


def to_markdown(frame: pd.DataFrame) -> str:
    """A GitHub Markdown table of a frame of strings (first column left, others right)."""
    columns = [str(c) for c in frame.columns]
    align = [":--"] + ["--:"] * (len(columns) - 1)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join(align) + "|"]
    for values in frame.astype(str).itertuples(index=False):
        lines.append("| " + " | ".join(v.replace("|", "\\|") for v in values) + " |")
    return "\n".join(lines) + "\n"


def latex_escape(text: str) -> str:
    """Escape LaTeX specials; ``±`` and ``–`` become math/text commands."""
    out = str(text)
    for char, escaped in (("\\", r"\textbackslash{}"), ("&", r"\&"), ("%", r"\%")):
        out = out.replace(char, escaped)
    for char, escaped in (("_", r"\_"), ("#", r"\#"), ("$", r"\$")):
        out = out.replace(char, escaped)
    return out.replace("±", r"$\pm$").replace("—", "--")


def to_latex(frame: pd.DataFrame, caption: str, label: str) -> str:
    """A booktabs ``table`` environment of a frame of strings."""
    columns = "l" + "r" * (len(frame.columns) - 1)
    body = [" & ".join(latex_escape(v) for v in row) + r" \\" for row in frame.astype(str).values]
    head = " & ".join(latex_escape(c) for c in frame.columns) + r" \\"
    return "\n".join(
        [
            r"\begin{table*}[t]",
            r"\centering",
            r"\small",
            rf"\caption{{{latex_escape(caption)}}}",
            rf"\label{{{label}}}",
            rf"\resizebox{{\textwidth}}{{!}}{{\begin{{tabular}}{{{columns}}}",
            r"\toprule",
            head,
            r"\midrule",
            *body,
            r"\bottomrule",
            r"\end{tabular}}",
            r"\end{table*}",
            "",
        ]
    )


def log_axis(ax) -> None:
    """Log-scale y axis with a few plain-number ticks (readable over narrow ranges too)."""
    ax.set_yscale("log")
    ax.yaxis.set_major_locator(MaxNLocator(5))
    ax.yaxis.set_major_formatter(ScalarFormatter(useOffset=False))
    ax.yaxis.set_minor_locator(NullLocator())


def save_figure(fig, out_dir: str | os.PathLike[str], stem: str) -> list[Path]:
    """Write ``<stem>.png`` and ``<stem>.pdf`` under ``out_dir``; returns their paths.

    The PDF carries no creation date, so the same data gives the same bytes.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{stem}.png", out / f"{stem}.pdf"]
    with mpl.rc_context({"pdf.fonttype": 42}):  # TrueType fonts: editable, journal-friendly
        for path in paths:
            metadata = {"CreationDate": None} if path.suffix == ".pdf" else None
            fig.savefig(path, dpi=DPI, bbox_inches="tight", metadata=metadata)
    return paths
