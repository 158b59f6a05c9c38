"""CUDA runs in the report: the step peak (above the epoch start) is the memory measure set
beside the paper's peak GPU memory, and the header says which measure ours is."""

from __future__ import annotations

import pandas as pd

from grab_exp.report.table1_paper import hardware_note, read_paper, side_by_side_frame
from grab_exp.report.table1_table import build_table1


def _frame(step_peak: bool) -> pd.DataFrame:
    rows = []
    for variant, ordering_mb in (("rr", 0.0), ("mean", 1.0)):
        for epoch in (1, 2):
            rows.append(
                {
                    "run": variant,
                    "variant": variant,
                    "pipeline": "functional",
                    "seed": 0,
                    "device": "cuda",
                    "epoch": epoch,
                    "train/loss": 1.0,
                    "test/acc": 0.5,
                    "time/epoch_s": 2.0,
                    "mem/peak_cuda_mb": 800.0 + ordering_mb,  # the dataset's 704 MiB included
                    "mem/step_peak_cuda_mb": 10.0 + ordering_mb if step_peak else float("nan"),
                    "mem/peak_rss_mb": 2000.0,
                }
            )
    return pd.DataFrame(rows)


def test_cuda_runs_compare_their_step_peak_with_the_papers_column():
    table = build_table1(_frame(step_peak=True))
    assert table.memory_source == "cuda_step" and table.memory_metric == "step_peak_cuda_mb"
    mean = table.data.set_index("variant").loc["mean"]
    assert mean["step_peak_cuda_mb_mean"] == 11.0
    assert abs(mean["mem_overhead_pct"] - 10.0) < 1e-9  # 11 vs 10 MB, not 801 vs 800
    assert abs(mean["mem_increment_mb"] - 1.0) < 1e-9  # the increment in MB beside the %
    shown = side_by_side_frame(table, read_paper(), part="cost")
    headers = [c for c in shown.columns if c.startswith("Peak GPU mem.")]
    assert headers and all("ours: step peak above epoch start" in c for c in headers)
    assert "dataset lives on the GPU" in hardware_note(table)


def test_runs_without_a_step_peak_say_their_peak_includes_the_dataset():
    table = build_table1(_frame(step_peak=False))
    assert table.memory_source == "cuda" and table.memory_metric == "peak_cuda_mb"
    shown = side_by_side_frame(table, read_paper(), part="cost")
    headers = [c for c in shown.columns if "GPU mem" in c]
    assert headers and all("dataset on GPU incl." in c for c in headers)
