"""The report (Table 1, paper side by side, Figures 1-2, W&B in and out, the notebook), built
from real smoke runs of ``python -m grab_exp`` made once for this module."""

from __future__ import annotations

import csv
import inspect
import json
import os
import runpy
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from support.wandb_reader import read_offline_runs

from grab_exp.report import (
    ReportWarning,
    build_table1,
    default_paper_csv,
    figure1,
    hardware_note,
    read_api_runs,
    read_epoch_bench,
    read_runs,
    runs_frame,
)
from grab_exp.report.cli import main
from grab_exp.report.collect import parse_wandb_path, read_wandb_runs
from grab_exp.report.table1_figures import figure2_caption, identical_rows
from grab_exp.report.table1_text import notes

REPO = Path(__file__).resolve().parents[2]
EPOCH_BENCH = REPO / "results" / "bench" / "epoch_1t.json"  # the committed idle-machine bench
ROWS = [("rr", "classic"), ("rr", "functional"), ("mean", "functional")]
SEEDS = [0, 1]
EPOCHS = 3  # fewer than 5: the "epoch 5" columns fall back to the last epoch
METRICS = ["train_loss_final", "train_loss_epoch3", "test_acc_final", "test_acc_epoch3"]
METRICS += ["time_s_per_epoch", "peak_rss_mb"]


def _wandb_env(home: Path) -> dict[str, str]:
    """Offline W&B, its folders in ``home``, no credentials, no network."""
    env = {f"WANDB_{name}": str(home / name.lower()) for name in ("CONFIG_DIR", "CACHE_DIR")}
    env |= {"WANDB_DATA_DIR": str(home / "data"), "WANDB_ARTIFACT_DIR": str(home / "art")}
    env |= {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "NETRC": str(home / "no-netrc")}
    return env | {"WANDB_ERROR_REPORTING": "false"}


@pytest.fixture(autouse=True)
def wandb_env(tmp_path_factory, monkeypatch):
    for name, value in _wandb_env(tmp_path_factory.getbasetemp() / "wandb_home").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.delenv("WANDB_BASE_URL", raising=False)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """A real multirun: rows rr_classic, rr, mean x seeds 0, 1, 3 epochs, W&B offline."""
    root = tmp_path_factory.mktemp("sweep")
    env = {**os.environ, **_wandb_env(root / "wandb_home")}
    env.pop("WANDB_API_KEY", None)
    command = [
        *(sys.executable, "-m", "grab_exp", "-m", "experiment=smoke"),
        *("row=rr_classic,rr,mean", f"seed={','.join(map(str, SEEDS))}", f"epochs={EPOCHS}"),
        *("dataset.num_train=64", "dataset.num_test=32", "device=cpu", "logger=wandb"),
        "progress=none",
        f"hydra.sweep.dir={root / 'smoke'}",
    ]
    done = subprocess.run(command, cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / "smoke"


@pytest.fixture(scope="module")
def report(sweep, tmp_path_factory) -> Path:
    """``python -m grab_exp.report <sweep> --out <dir> --bench <epoch_1t.json>`` (in-process)."""
    out = tmp_path_factory.mktemp("report")
    assert main([str(sweep), "--out", str(out), "--log-loss", "--bench", str(EPOCH_BENCH)]) == 0
    return out


def table1_frame(paths) -> pd.DataFrame:
    """Table 1's frame of the runs under ``paths``, as ``python -m grab_exp.report`` reads it."""
    return runs_frame(read_runs(paths))


def run_dirs(sweep: Path) -> list[Path]:
    return sorted(path.parent for path in sweep.rglob("summary.json"))


def read_csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as handle:
        return list(csv.DictReader(handle))


def expected_table(sweep: Path) -> dict[tuple[str, str], dict[str, tuple[float, float, int]]]:
    """Table 1 recomputed from the metrics.csv files with the csv and statistics modules."""
    per_row: dict[tuple[str, str], dict[str, list[float]]] = {}
    for run_dir in run_dirs(sweep):
        summary = json.loads((run_dir / "summary.json").read_text())
        rows = read_csv_rows(run_dir / "metrics.csv")
        last, early = rows[-1], rows[min(5, len(rows)) - 1]
        values = {
            "train_loss_final": float(last["train/loss"]),
            "train_loss_epoch3": float(early["train/loss"]),
            "test_acc_final": float(last["test/acc"]),
            "test_acc_epoch3": float(early["test/acc"]),
            "time_s_per_epoch": statistics.fmean(float(r["time/epoch_s"]) for r in rows),
            "peak_rss_mb": max(float(r["mem/peak_rss_mb"]) for r in rows),
        }
        target = per_row.setdefault((summary["variant"], summary["pipeline"]), {})
        for name, value in values.items():
            target.setdefault(name, []).append(value)
    return {
        row: {m: (statistics.fmean(v), statistics.stdev(v), len(v)) for m, v in values.items()}
        for row, values in per_row.items()
    }


# ------------------------------------------------------------------ frame and Table 1


def test_frame_holds_every_run_and_epoch(sweep):
    frame = table1_frame([sweep])
    assert len(frame) == len(ROWS) * len(SEEDS) * EPOCHS
    assert list(frame.columns[:6]) == ["run", "variant", "pipeline", "seed", "device", "epoch"]
    for run_dir in run_dirs(sweep):
        rows = read_csv_rows(run_dir / "metrics.csv")
        got = frame[frame["run"] == str(run_dir.resolve())]
        assert got["epoch"].tolist() == [int(r["epoch"]) for r in rows]
        assert got["train/loss"].tolist() == pytest.approx([float(r["train/loss"]) for r in rows])
        assert got["test/acc"].tolist() == pytest.approx([float(r["test/acc"]) for r in rows])


def test_table1_values_match_the_runs(sweep, report):
    expected = expected_table(sweep)
    table = {(r["variant"], r["pipeline"]): r for r in read_csv_rows(report / "table1.csv")}
    assert set(table) == set(expected)
    for row, metrics in expected.items():
        assert int(table[row]["n_seeds"]) == len(SEEDS)
        for metric, (mean, std, _) in metrics.items():
            assert float(table[row][f"{metric}_mean"]) == pytest.approx(mean, rel=1e-9)
            assert float(table[row][f"{metric}_std"]) == pytest.approx(std, rel=1e-9, abs=1e-12)
    base = expected[("rr", "functional")]
    bench = {r["row"]: r["epoch_s"] for r in json.loads(EPOCH_BENCH.read_text())["rows"]}
    bench_s = {("rr", "classic"): bench["rr-classic"], ("rr", "functional"): bench["rr"]}
    bench_s[("mean", "functional")] = bench["mean"]
    for row, metrics in expected.items():
        time_pct = 100 * (bench_s[row] / bench_s[("rr", "functional")] - 1)  # never the runs'
        mem_pct = 100 * (metrics["peak_rss_mb"][0] / base["peak_rss_mb"][0] - 1)
        assert float(table[row]["bench_epoch_s"]) == pytest.approx(bench_s[row])
        assert float(table[row]["time_overhead_pct"]) == pytest.approx(time_pct)
        assert float(table[row]["mem_overhead_pct"]) == pytest.approx(mem_pct)


def test_without_a_bench_there_is_no_time_overhead(sweep):
    table = build_table1(table1_frame([sweep])).data
    assert table["time_overhead_pct"].isna().all() and table["bench_epoch_s"].isna().all()
    assert table["mem_overhead_pct"].notna().all()


def test_the_time_columns_name_the_bench_file_commit_threads_and_processor(tmp_path):
    """Table 1's caption, its notes beside the paper and Figure 2's title name the file their
    idle-machine times come from, with the commit, thread count and processor of its
    ``machine`` block; a file without a commit says so."""
    frame = table1_frame([REPO / "results" / "table1" / "runs"])
    names = ["rr-classic", "rr", "mean", "pair", "batch", "recursive", "recursive_pair"]
    rows = [{"row": name, "step_ms": 2.0 + i, "epoch_s": 6.0 + i} for i, name in enumerate(names)]
    machine = {"cpu": "Some CPU", "torch_threads": 1, "commit": "0123456" + "0" * 33}
    cases = [
        (machine | {"dirty": False}, "commit 0123456, 1 thread, Some CPU"),
        (
            machine | {"dirty": True, "torch_threads": 2},
            "commit 0123456 with uncommitted changes, 2 threads, Some CPU",
        ),
        ({"cpu": "Some CPU", "torch_threads": 2}, "commit not recorded, 2 threads, Some CPU"),
    ]
    for block, expected in cases:
        path = tmp_path / "x.json"
        path.write_text(json.dumps({"benchmark": "epoch", "machine": block, "rows": rows}))
        table = build_table1(frame, bench=read_epoch_bench(path, name="x.json"))
        assert (table.time_source, table.time_machine) == ("x.json", expected)
        assert f"from x.json ({expected}), one measurement per row" in " ".join(notes(table))
        assert f"benchmark x.json ({expected}): each row's" in hardware_note(table)
        assert f"benchmark x.json ({expected}), seconds per epoch" in figure2_caption(table)


def test_table1_columns_rows_and_headers(report):
    with (report / "table1.csv").open(newline="") as handle:
        header = next(csv.reader(handle))
    stats = [f"{metric}_{kind}" for metric in METRICS for kind in ("mean", "std")]
    ids = ["variant", "pipeline", "label", "n_seeds", "final_epoch", "mem_source"]
    overheads = ["time_overhead_pct", "mem_overhead_pct", "mem_increment_mb", "mem_increment_se_mb"]
    assert header == [*ids, *stats, "bench_epoch_s", *overheads]
    rows = read_csv_rows(report / "table1.csv")
    assert [(r["variant"], r["pipeline"]) for r in rows] == ROWS
    markdown = (report / "table1.md").read_text()
    assert markdown.splitlines()[4].split(" | ")[2:] == [
        "Train loss (final, ep. 3)",
        "Train loss (ep. 3, last)",
        "Test acc. (final, ep. 3)",
        "Test acc. (ep. 3, last)",
        "Time (s/epoch, during the runs)",
        "Peak RSS (MB)",
        "Time, idle bench (s/epoch)",
        "Time overhead (idle bench)",
        "Mem. overhead |",
    ]
    assert "- Time, idle bench: " in markdown  # the notes name the bench file
    assert "results/bench/epoch_1t.json (commit " in markdown
    labels = [line.split(" | ")[0] for line in markdown.splitlines()[6:9]]
    assert labels == ["| RR (classic)", "| RR (functional)", "| Mean"]
    assert " ± " in markdown
    latex = (report / "table1.tex").read_text()
    assert r"\begin{tabular}" in latex and r"$\pm$" in latex and r"\%" in latex


def test_side_by_side_has_the_paper_values(report):
    paper_csv = default_paper_csv()  # the file the report read: the committed copy first
    if not (report / "table1_vs_paper.csv").exists():
        pytest.skip(f"the published table is not here ({paper_csv})")
    paper = {(r["variant"], r["pipeline"]): r for r in read_csv_rows(paper_csv)}
    merged = read_csv_rows(report / "table1_vs_paper.csv")
    assert [(r["variant"], r["pipeline"]) for r in merged][:3] == ROWS
    for row in merged:
        published = paper[(row["variant"], row["pipeline"])]
        assert float(row["train_loss_epoch3_paper"]) == float(published["train_loss_epoch5"])
        assert float(row["peak_rss_mb_paper"]) == float(published["peak_gpu_mem_mb"])
    note = (report / "table1_vs_paper.md").read_text()
    assert "RTX 2060" in note and "device cpu" in note and "RSS" in note
    assert "## Loss and accuracy" in note and "## Time and memory" in note  # two tables
    widths = {line.count(" | ") for line in note.splitlines() if line.startswith("| Row")}
    assert max(widths) <= 10  # no table of 18 columns
    assert "log2(16) = 4 levels and 15 accumulators" in note


def test_figures_are_written_with_one_color_per_row(sweep, report):
    for stem in ("figure1", "figure2"):
        png, pdf = report / f"{stem}.png", report / f"{stem}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
        assert pdf.read_bytes()[:5] == b"%PDF-" and pdf.stat().st_size > 5_000
    frame = table1_frame([sweep])
    figure = figure1(frame)
    same = identical_rows(frame, ROWS)
    functional_rr = "RR (functional)" + (": identical to RR (classic)" if same else "")
    for ax in figure.axes:
        styles = {
            line.get_label(): (line.get_color(), line.get_marker()) for line in ax.get_lines()
        }
        assert styles == {  # the first three of Okabe-Ito's colors (gray, black, blue)
            "RR (classic)": ("#7f7f7f", "o"),
            functional_rr: ("#000000", "x"),
            "Mean": ("#0072B2", "s"),
        }
    labels = [text.get_text() for text in figure.legends[0].texts]
    assert labels[-1] == f"± 1 std over {len(SEEDS)} seeds"
    bands = [ax for ax in figure.axes if ax.collections]  # every panel shades the seeds' std
    assert len(bands) == len(figure.axes) == 4  # 3 epochs: all of them and the first 2
    captions = (report / "figures.md").read_text()
    assert captions.startswith("# Figures\n\n**Figure 1.** ") and "**Figure 2.** " in captions


def test_identical_rows_need_every_value_equal(sweep):
    frame = table1_frame([sweep])
    rr = frame[(frame["variant"] == "rr") & (frame["pipeline"] == "functional")]
    twin = rr.assign(variant="mean")  # RR's runs again, under another row
    rows = [("rr", "functional"), ("mean", "functional")]
    assert identical_rows(pd.concat([rr, twin]), rows) == {rows[1]: rows[0]}
    twin = twin.reset_index(drop=True)
    twin.loc[len(twin) - 1, "test/acc"] += 1e-6
    assert identical_rows(pd.concat([rr, twin]), rows) == {}


# ------------------------------------------------------------------ runs that are left out


def copy_sweep(sweep: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "sweep"
    shutil.copytree(sweep, copy, ignore=shutil.ignore_patterns("wandb", "checkpoint.pt"))
    return copy


def test_unfinished_run_is_skipped_with_a_warning(sweep, tmp_path):
    copy = copy_sweep(sweep, tmp_path)
    victim = run_dirs(copy)[0]
    summary = json.loads((victim / "summary.json").read_text())
    (victim / "summary.json").write_text(json.dumps({**summary, "status": "running"}))
    orphan = run_dirs(copy)[1]
    (orphan / "summary.json").unlink()  # a job that never wrote its summary
    with pytest.warns(ReportWarning) as caught:
        frame = table1_frame([copy])
    messages = [str(warning.message) for warning in caught]
    assert (  # no job holds its lock: the advice is to resume, not to wait
        f"skipping unfinished run {victim} (status 'running'): no job holds it (killed or "
        "crashed); the command that started it resumes it"
    ) in messages
    assert (
        f"skipping {orphan}: no summary.json (a job that never started, or stopped first)"
        in messages
    )
    assert not {str(victim), str(orphan)} & set(frame["run"])
    assert frame["run"].nunique() == len(ROWS) * len(SEEDS) - 2


DAMAGES = ["missing", "empty", "header only", "garbage", "truncated row", "binary"]


def damage_metrics(metrics: Path, damage: str) -> None:
    header = metrics.read_text().splitlines()[0]
    {
        "missing": lambda: metrics.unlink(),
        "empty": lambda: metrics.write_text(""),
        "header only": lambda: metrics.write_text(header + "\n"),
        "garbage": lambda: metrics.write_text('x,"y\n1,2,3,4\n'),
        "truncated row": lambda: metrics.write_text(f"{header}\n1,2.30,0.1\n"),
        "binary": lambda: metrics.write_bytes(b"\x00\xff\xfe" * 50),
    }[damage]()


def test_missing_or_corrupt_metrics_are_reported_by_name(sweep, tmp_path):
    copy = copy_sweep(sweep, tmp_path)
    victims = dict(zip(DAMAGES, run_dirs(copy), strict=False))
    for damage, victim in victims.items():
        damage_metrics(victim / "metrics.csv", damage)
    with pytest.warns(ReportWarning) as caught:
        frame = table1_frame([copy])
    messages = sorted(str(warning.message) for warning in caught)
    assert len(messages) == len(victims)
    for damage, victim in victims.items():
        (message,) = [m for m in messages if m.startswith(f"skipping {victim}:")]
        assert ("no metrics.csv" if damage == "missing" else "corrupt metrics.csv") in message
    assert frame.empty  # six runs, six damages


def test_cli_names_a_broken_run_and_reports_the_others(sweep, tmp_path, capsys):
    copy = copy_sweep(sweep, tmp_path)
    victim = run_dirs(copy)[-1]
    damage_metrics(victim / "metrics.csv", "garbage")
    assert main([str(copy), "--out", str(tmp_path / "out"), "--no-paper"]) == 0
    err = capsys.readouterr().err
    assert f"warning: skipping {victim}: corrupt metrics.csv" in err and "Traceback" not in err
    assert len(read_csv_rows(tmp_path / "out" / "table1.csv")) == len(ROWS)
    assert not (tmp_path / "out" / "table1_vs_paper.csv").exists()


def test_nothing_to_report_is_an_error_not_a_traceback(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    assert main([str(tmp_path / "empty"), "--out", str(tmp_path / "out")]) == 1
    assert "no finished runs" in capsys.readouterr().err
    sys_argv = sys.argv
    try:  # python -m grab_exp.report table1 <absent> --out <dir>
        sys.argv = ["grab_exp.report", "table1", str(tmp_path / "absent"), "--out", "out"]
        with pytest.raises(SystemExit) as exit_info:
            runpy.run_module("grab_exp.report", run_name="__main__", alter_sys=True)
    finally:
        sys.argv = sys_argv
    assert exit_info.value.code == 1 and "no such run" in capsys.readouterr().err


# ------------------------------------------------------------------ W&B


def api_run(run: dict, state: str = "finished", job_type: str | None = None, name=None):
    """A real ``wandb.apis.public.Run`` built from a GraphQL-shaped record (the fields of
    W&B's RUN_FRAGMENT; config as the server's JSON of ``{"key": {"value": ...}}``) holding a
    real offline run's records. Only ``scan_history`` is replaced: it needs the network."""
    from wandb.apis.public import Run

    config = {key: {"value": value, "desc": None} for key, value in run["config"].items()}
    config["_wandb"] = {"value": {"cli_version": "0.31.0"}, "desc": None}  # internal: dropped
    attrs = {
        "id": f"id-{run['run_id']}",
        "name": run["run_id"],
        "displayName": name or run["name"],
        "state": state,
        "group": run["group"],
        "jobType": job_type,
        "config": json.dumps(config),
        "summaryMetrics": json.dumps(run["summary"]),
        "systemMetrics": "{}",
        "tags": run["tags"],
        "historyKeys": None,
    }
    api_run = Run(None, "local", run["project"], run["run_id"], attrs=attrs, lazy=False)
    api_run.scan_history = lambda keys=None, page_size=1000, min_step=0, max_step=None: iter(
        run["history"]
    )
    return api_run


def test_wandb_runs_give_the_same_frame_and_table(sweep):
    offline = list(read_offline_runs(sweep).values())
    assert len(offline) == len(ROWS) * len(SEEDS)
    runs = [api_run(run) for run in offline[1:]]
    runs.append(api_run(offline[0], name="renamed-by-hand"))  # identified from its config
    runs.append(api_run(offline[0], job_type="report"))  # a report run: ignored
    runs.append(api_run(offline[0] | {"run_id": "x"}, state="crashed"))
    with pytest.warns(ReportWarning, match="unfinished W&B run wandb:local/grab-exp/x"):
        remote = runs_frame(read_api_runs(runs))
    local = table1_frame([sweep])
    keys = ["variant", "pipeline", "seed", "device", "epoch"]
    assert remote[keys].values.tolist() == local[keys].values.tolist()
    for column in ("train/loss", "test/acc", "time/epoch_s", "mem/peak_rss_mb"):
        assert remote[column].tolist() == pytest.approx(local[column].tolist())
    remote_table, local_table = build_table1(remote).data, build_table1(local).data
    numeric = [c for c in local_table.columns if c.endswith(("_mean", "_std", "_pct"))]
    assert remote_table[numeric].values == pytest.approx(local_table[numeric].values, nan_ok=True)


def test_wandb_api_calls_match_the_installed_public_api():
    import wandb
    from wandb.apis.public import Run

    assert parse_wandb_path("me/proj/table1") == ("me/proj", "table1")
    assert parse_wandb_path("me/proj") == ("me/proj", None)
    with pytest.raises(ValueError, match="ENTITY/PROJECT"):
        parse_wandb_path("proj")
    calls = []
    api = SimpleNamespace(runs=lambda *args, **kwargs: calls.append((args, kwargs)) or [])
    assert read_wandb_runs("me/proj/table1", api) == []
    args, kwargs = calls[0]
    assert (args, kwargs) == (("me/proj",), {"filters": {"group": "table1"}})
    inspect.signature(wandb.Api.runs).bind(None, *args, **kwargs)  # what we call exists
    inspect.signature(Run.scan_history).bind(None)


def test_log_to_wandb_offline_holds_table_and_figures(report, sweep, tmp_path):
    out = tmp_path / "out"
    args = [str(sweep), "--out", str(out), "--log-to-wandb", "--wandb-mode", "offline"]
    assert main([*args, "--wandb-group", "smoke"]) == 0
    (run,) = read_offline_runs(out).values()
    assert run["group"] == "smoke" and run["exit_code"] == 0
    summary = run["summary"]
    files = Path(run["files"][0]).parent / "files"
    for name, kind in [("table1", "table-file"), ("figure1", "image-file")]:
        assert summary[f"{name}._type"] == kind
        assert (files / summary[f"{name}.path"]).stat().st_size > 0
    assert summary["figure2._type"] == "image-file"
    assert (
        summary["table1_vs_paper._type"] == "table-file"
        or not (report / "table1_vs_paper.csv").exists()
    )
    logged = json.loads((files / summary["table1.path"]).read_text())
    expected = read_csv_rows(out / "table1.csv")
    assert logged["columns"] == list(expected[0])
    assert [row[:2] for row in logged["data"]] == [[r["variant"], r["pipeline"]] for r in expected]
    column = logged["columns"].index("train_loss_final_mean")
    assert [row[column] for row in logged["data"]] == pytest.approx(
        [float(r["train_loss_final_mean"]) for r in expected]
    )


# ------------------------------------------------------------------ the notebook


def test_notebook_executes_on_the_runs(sweep, tmp_path, monkeypatch):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    source = REPO / "notebooks" / "reproduce_figures.ipynb"
    notebook = nbformat.read(source, as_version=4)
    monkeypatch.setenv("GRAB_RESULTS_DIR", str(sweep))
    client = nbclient.NotebookClient(
        notebook,
        timeout=120,
        kernel_name="python3",
        resources={"metadata": {"path": str(source.parent)}},
    )
    client.execute()  # raises CellExecutionError on any failing cell
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    images = [out for out in outputs if "image/png" in out.get("data", {})]
    assert len(images) == 2
    markdown = "".join(out.get("data", {}).get("text/markdown", "") for out in outputs)
    assert "RR (classic)" in markdown and "Mean" in markdown


def test_the_paired_table_is_each_row_minus_rr_functional_of_the_same_seed(sweep, report):
    """Against the runs' own metrics.csv: the difference per row, seed and epoch, and the
    count of seeds on the better side (higher accuracy, lower loss)."""
    values = {}  # (variant, pipeline, seed, epoch, metric) -> value
    for run in run_dirs(sweep):
        config = json.loads((run / "summary.json").read_text())["identity"]
        for line in read_csv_rows(run / "metrics.csv"):
            for metric in ("test/acc", "train/loss", "train/running_loss"):
                key = (config["variant"], config["pipeline"], config["seed"], int(line["epoch"]))
                values[(*key, metric)] = float(line[metric])
    paired = pd.read_csv(report / "table1_paired.csv")
    assert set(paired["epoch"]) == {EPOCHS}  # the early epoch falls back to the last one
    assert set(zip(paired["variant"], paired["pipeline"], strict=True)) == {
        ("rr", "classic"),
        ("mean", "functional"),
    }
    assert len(paired) == 2 * len(SEEDS) * 3  # rows x seeds x metrics (running loss too)
    for r in paired.itertuples():
        mine = values[(r.variant, r.pipeline, r.seed, r.epoch, r.metric)]
        base = values[("rr", "functional", r.seed, r.epoch, r.metric)]
        assert r.difference == pytest.approx(mine - base, abs=1e-12)
    text = (report / "table1_paired.md").read_text()
    mean_acc = paired[(paired["row"] == "Mean") & (paired["metric"] == "test/acc")]
    better = int((mean_acc["difference"] > 0).sum())
    assert f"| Mean | {mean_acc['difference'].iloc[0]:+.4f} |" in text
    assert f"| {better} of {len(SEEDS)} |" in text


STATE_BENCH = REPO / "results" / "bench" / "training_state.json"  # the committed state bench


def test_the_state_bench_is_the_memory_column_and_figure_2s_memory_panel(sweep, tmp_path):
    out = tmp_path / "report"
    args = [str(sweep), "--out", str(out), "--bench", str(EPOCH_BENCH), "--state"]
    assert main([*args, str(STATE_BENCH)]) == 0
    totals = {r["row"]: r["total"] / 2**20 for r in json.loads(STATE_BENCH.read_text())["rows"]}
    table = read_csv_rows(out / "table1.csv")
    keys = {
        ("rr", "classic"): "rr-classic",
        ("rr", "functional"): "rr",
        ("mean", "functional"): "mean",
    }
    for row in table:
        assert float(row["state_mb_mean"]) == pytest.approx(
            totals[keys[row["variant"], row["pipeline"]]]
        )
        assert row["mem_source"] == "state"
    base = totals["rr"]
    mean = next(r for r in table if r["variant"] == "mean")
    assert float(mean["mem_overhead_pct"]) == pytest.approx(100 * (totals["mean"] / base - 1))
    assert float(mean["mem_increment_mb"]) == pytest.approx(totals["mean"] - base)
    assert all(row["state_mb_std"] == "" for row in table)  # one measurement: no std
    markdown = (out / "table1.md").read_text()
    assert "training state's allocated bytes" in markdown
    assert f"| {totals['mean']:.2f} |" in markdown  # the value alone, no "± 0.00"
    assert f"{totals['mean'] - base:+.2f} MB" in markdown
    assert "ours: training state" in (out / "table1_vs_paper.md").read_text()
    not_state = tmp_path / "epoch.json"
    not_state.write_text(EPOCH_BENCH.read_text())
    assert main([*args, str(not_state)]) == 1  # an epoch bench is not a state bench


def test_without_scipy_the_report_warns_and_writes_everything_but_the_tests(
    sweep, tmp_path, monkeypatch, capsys
):
    """The GPU image has no SciPy: the report still writes its tables and figures, and one
    warning says the paired tests are missing."""
    monkeypatch.setitem(sys.modules, "scipy", None)  # import scipy raises ImportError
    out = tmp_path / "report"
    assert main([str(sweep), "--out", str(out), "--bench", str(EPOCH_BENCH)]) == 0
    assert "warning: no paired tests" in capsys.readouterr().err
    assert (out / "table1.md").is_file() and (out / "figures.md").is_file()
    assert not (out / "table1_tests.csv").exists()
