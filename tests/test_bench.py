"""The benchmarks run in a short mode and write the documented JSON fields."""

from __future__ import annotations

import json

from grab_exp.balance import Balance
from grab_exp.bench import epoch, sorters
from grab_exp.bench.epoch import ROWS


def test_sorters_bench_reports_every_ordering(tmp_path, capsys):
    out = tmp_path / "sorters.json"
    rows = sorters.main(["--n", "64", "--d", "100", "--repeats", "3", "--json", str(out)])
    assert [r["variant"] for r in rows] == list(Balance.registry)
    assert json.loads(out.read_text()) == rows
    assert all(r["step_ms"] > 0 and r["state_bytes"] > 0 for r in rows)
    assert "recursive_pair" in capsys.readouterr().out


def test_epoch_bench_short_mode_writes_json(tmp_path):
    out = tmp_path / "epoch.json"
    epoch.main(["--steps", "1", "--repeats", "2", "--warmup", "1", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["benchmark"] == "epoch"
    assert {"cpu", "torch", "torch_threads", "device"} <= set(report["machine"])
    names = [r["row"] for r in report["rows"]]
    assert names == [v if p == "functional" else f"{v}-{p}" for v, p in ROWS]
    for row in report["rows"]:
        assert set(row) == {
            "row",
            "step_ms",
            "epoch_s",
            "ratio_to_classic_rr",
            "breakdown_ms",
            "sorter_state_bytes",
        }
        assert set(row["breakdown_ms"]) == {"grads", "sorter", "opt"}
        assert row["epoch_s"] > 0
    assert report["rows"][0]["ratio_to_classic_rr"] == 1.0
