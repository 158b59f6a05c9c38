"""Table 1 as text: display cells (mean ± std), Markdown and LaTeX writers, column headers."""

from __future__ import annotations

import math

import pandas as pd

from grab_exp.report.table import EARLY_EPOCH, Table1

_DECIMALS = {"train_loss": 4, "test_acc": 4, "time_s": 2, "peak": 1}
_MEMORY_NAMES = {
    "cuda_step": "Step peak CUDA mem. (MB)",
    "cuda": "Peak CUDA mem. (MB)",
    "rss": "Peak RSS (MB)",
    "mixed": "Peak mem. (MB)",
}


def decimals(metric: str) -> int:
    """Decimals shown for ``metric`` (4 for losses and accuracies, 2 for s, 1 for MB)."""
    return next((d for prefix, d in _DECIMALS.items() if metric.startswith(prefix)), 3)


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


def seconds(value: float) -> str:
    """Seconds with two decimals; ``—`` when missing."""
    return "—" if value is None or math.isnan(value) else f"{value:.2f}"


def epoch_note(table: Table1) -> tuple[str, str]:
    """Header notes of the final and early columns, e.g. ``("final, ep. 100", "ep. 5")``;
    the early one reads ``ep. 3, last`` when the runs stopped before epoch 5."""
    finals = table.final_epochs
    final = f"ep. {finals[0]}" if len(finals) == 1 else f"ep. {finals[0]}-{finals[-1]}"
    early = f"ep. {table.early_epoch}"
    if table.early_epoch < EARLY_EPOCH:
        early += ", last"
    return f"final, {final}", early


def headers(table: Table1) -> dict[str, str]:
    """Display header of each metric of ``table``."""
    final, early = epoch_note(table)
    names = [
        f"Train loss ({final})",
        f"Train loss ({early})",
        f"Test acc. ({final})",
        f"Test acc. ({early})",
        "Time (s/epoch, during the runs)",
        _MEMORY_NAMES[table.memory_source],
    ]
    return dict(zip(table.metrics, names, strict=True))


def display_frame(table: Table1) -> pd.DataFrame:
    """Table 1 as strings, one column per displayed quantity, ready for Markdown/LaTeX."""
    data, names = table.data, headers(table)
    shown = pd.DataFrame({"Row": data["label"], "Seeds": data["n_seeds"].astype(str)})
    for metric in table.metrics:
        shown[names[metric]] = [
            cell(m, s, decimals(metric))
            for m, s in zip(data[f"{metric}_mean"], data[f"{metric}_std"], strict=True)
        ]
    shown["Time, idle bench (s/epoch)"] = data["bench_epoch_s"].map(seconds)
    shown["Time overhead (idle bench)"] = data["time_overhead_pct"].map(percent)
    shown["Mem. overhead"] = data["mem_overhead_pct"].map(percent)
    return shown


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


def caption(table: Table1) -> str:
    """Table 1's caption: what the cells are, the epochs and the memory measure."""
    final, early = epoch_note(table)
    memory = {
        "cuda_step": "peak CUDA memory allocated above the epoch start (dataset on the GPU "
        "excluded)",
        "cuda": "peak CUDA memory allocated (the dataset on the GPU included)",
        "rss": "peak process RSS (no CUDA device)",
        "mixed": "peak CUDA memory where measured, else peak process RSS",
    }[table.memory_source]
    bench = (
        f"idle bench = training seconds per epoch on an otherwise idle machine "
        f"({table.time_source}: median step time x steps per epoch), the source of the time "
        "overhead"
        if table.time_source
        else "no idle-machine benchmark given, so no time overhead"
    )
    return (
        "Table 1 reproduced: mean ± std over seeds (Seeds = count); final columns at "
        f"{final.removeprefix('final, ')}, early columns at {early}; time during the runs = "
        "mean training seconds per epoch as the jobs measured them (machine load included; "
        f"not comparable between rows); {bench}; memory = {memory}; "
        f"overheads relative to RR (functional). Device: {', '.join(table.devices)}."
    )
