"""The benchmarks run in a short mode and write the documented JSON fields."""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from support.grab_run import compose_job, grab_env, run_grab
from support.run_files import computed, read_rows, run_dirs
from torch.nn import functional as F

from grab_exp.balance import Ordering
from grab_exp.bench import conv, epoch, orderings, state, sweep
from grab_exp.bench.__main__ import BENCHMARKS
from grab_exp.bench.epoch import GSNR_ROWS, ROWS, STAGES, row_name
from grab_exp.bench.memory import CPU_METHOD, peak_step_bytes
from grab_exp.bench.operators import OperatorCount, operator_times
from grab_exp.models import MLP
from grab_exp.per_sample import PerSamplePipeline
from grab_exp.report.table1_table import read_epoch_bench
from grab_exp.runner.launch.checks import hydra_config_of
from grab_exp.runner.rundir.resolvers import variant_dir
from grab_exp.runner.training.step import StepParts, train_step
from grab_exp.sampler import GraBSampler

CPU = torch.device("cpu")
LENET_FLOATS = 62_006


def test_orderings_bench_reports_every_ordering(tmp_path, capsys):
    out = tmp_path / "orderings.json"
    rows = orderings.main(["--n", "64", "--d", "100", "--repeats", "3", "--out", str(out)])
    assert [r["variant"] for r in rows] == list(Ordering.choices())
    written = json.loads(out.read_text())
    assert written["rows"] == rows and written["benchmark"] == "orderings"
    assert written["settings"]["repeats"] == 3 and written["settings"]["d"] == 100
    assert {"cpu", "cpu_count", "torch", "torch_threads", "device"} <= set(written["machine"])
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True)
    commit = head.stdout.strip() if head.returncode == 0 else None  # None outside a checkout
    assert written["machine"]["commit"] == commit  # the code that ran
    assert isinstance(written["machine"]["dirty"], bool) == (commit is not None)
    assert all(r["step_ms"] > 0 and r["state_bytes"] > 0 for r in rows)
    assert "recursive_pair" in capsys.readouterr().out


def test_orderings_bench_runs_recursive_at_every_depth(tmp_path):
    out = tmp_path / "orderings.json"
    rows = orderings.main(
        ["--n", "64", "--d", "50", "--repeats", "2", "--depths", "0,3,4", "--out", str(out)]
    )
    recursive = [r for r in rows if r["variant"] == "recursive"]
    assert [r["depth"] for r in recursive] == [0, 3, 4]
    floats = [r["state_bytes"] for r in recursive]  # 2^(D+1) - 1 nodes of 50 floats, and more
    assert floats[1] - floats[0] == (15 - 1) * 50 * 4 and floats[2] - floats[1] == 16 * 50 * 4
    assert all("depth" not in r for r in rows if r["variant"] != "recursive")


def test_conv_bench_formulations_agree_and_are_reported(tmp_path):
    layer = torch.nn.Conv2d(3, 4, 3)
    a = torch.randn(2, 3, 6, 6)
    g = torch.randn(layer(a).shape)
    calls = conv.formulations(layer, a, g)
    want = calls["ours"]()[0]  # (B, O, C, kh, kw)
    for name in ("grouped_forward", "groups_weight_grad", "groups_weight_grad_cl", "unfold_bmm"):
        torch.testing.assert_close(calls[name]().reshape(want.shape), want)
    torch.testing.assert_close(calls["classic"](), want.sum(0))
    out = tmp_path / "conv.json"
    rows = conv.main(["--repeats", "1", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == rows
    assert [(r["C"], r["O"]) for r in rows][:2] == [(3, 6), (6, 16)]  # LeNet's convolutions


def test_cpu_peak_is_the_most_bytes_live_at_once():
    def step():  # 1 MB + 2 MB live together, then 0.5 MB after the 1 MB is gone
        a = torch.empty(250_000)
        b = torch.empty(500_000)
        del a
        c = torch.empty(125_000)
        del b, c

    assert peak_step_bytes(step, CPU) == 3_000_000


def test_cpu_peak_counts_frees_of_what_the_previous_step_left():
    kept = {"x": torch.ones(250_000)}

    def step():  # frees last step's 1 MB, then 2 MB + 1 MB: 2 MB above the start
        kept["x"] = None
        scratch = torch.empty(500_000)
        kept["x"] = torch.ones(250_000)
        del scratch

    assert peak_step_bytes(step, CPU) == 2_000_000


@pytest.fixture(scope="module")
def epoch_report(tmp_path_factory):
    out = tmp_path_factory.mktemp("epoch") / "epoch.json"
    args = ["--steps", "1", "--repeats", "2", "--warmup", "1", "--captured", "yes"]
    args += ["--profile-steps", "2"]
    epoch.main([*args, "--out", str(out)])
    return json.loads(out.read_text())


def test_epoch_bench_short_mode_writes_json(epoch_report):
    report = epoch_report
    assert report["benchmark"] == "epoch"
    assert report["done"] == [
        "timing 1/2",
        "timing 2/2",
        "limits",
        "profile",
        "memory",
        "operators",
    ]
    assert report["complete"]
    assert {"cpu", "torch", "torch_threads", "device"} <= set(report["machine"])
    names = [r["row"] for r in report["rows"]]
    compared = [row_name(v, p) + "@hooks" for v, p in ROWS if p == "functional"]
    table = [row_name(v, p) for v, p in ROWS] + [row_name(*r) for r in GSNR_ROWS]
    graphs = [row_name(v, p) + ":graph" for v, p in ROWS]  # --captured yes: traced on the CPU
    assert names == table + compared + graphs
    assert names[0] == "rr-classic" and "rr+vr_momentum" in names
    methods = {r["row"]: r["method"] for r in report["rows"]}
    assert methods["rr-classic"] == "classic" and methods["mean@hooks"] == "hooks"
    assert methods["mean"] == "factored"  # auto: LeNet's Linear layers hold 95% of the weights
    assert methods["recursive"] == "factored"  # it writes the centered rows from the factors
    for row in report["rows"]:
        assert set(row) == {
            "row",
            "method",
            "step_ms",
            "mean_step_ms",
            "epoch_s",
            "ratio_to_classic_rr",
            "breakdown_ms",
            "limits",
            "limit_multiples",
            "ordering_state_bytes",
            "peak_step_bytes",
            "operators",
            "profile",
        }
        assert set(row["breakdown_ms"]) == set(STAGES)
        paths = (
            {"captured"} if row["row"].endswith(":graph") else {"eager", "cuda_path", "captured"}
        )
        assert set(row["operators"]) == paths
        for path in paths - {"captured"}:
            counts = row["operators"][path]
            assert counts["total"] == sum(v for k, v in counts.items() if k != "total") > 0
        assert row["operators"]["captured"]["per_step"] == 4  # 3 input copies, 1 graph launch
        assert row["epoch_s"] > 0
    assert report["rows"][0]["ratio_to_classic_rr"] == 1.0


def test_epoch_bench_sets_each_stage_against_its_limit(epoch_report):
    rates = epoch_report["rates"]
    assert rates["stream_gb_s"] > 0 and rates["matmul_gflop_s"] > 0
    rows = {row["row"]: row for row in epoch_report["rows"]}
    for name, row in rows.items():
        ran = {stage for stage, ms in row["breakdown_ms"].items() if ms is not None}
        if name.endswith(":graph"):
            ran = {"grads", "ordering", "opt"}  # a captured step times no stages
        assert set(row["limits"]) == ran, name
        for limit in row["limits"].values():
            has_work = limit["bytes"] > 0 or limit["flops"] > 0
            assert (limit["limit_ms"] > 0) == has_work, name
    classic, mean = rows["rr-classic"], rows["mean"]
    assert classic["limits"]["ordering"]["limit_ms"] == 0  # RR reads no gradients
    assert classic["limit_multiples"]["ordering"] is None
    assert mean["limit_multiples"]["ordering"] > 0
    # the functional step writes the per-sample rows: more bytes than the classic one, same flops
    assert mean["limits"]["grads"]["bytes"] > classic["limits"]["grads"]["bytes"]
    assert mean["limits"]["grads"]["flops"] == classic["limits"]["grads"]["flops"] > 0


def test_epoch_bench_counts_the_operators_of_each_step(epoch_report):
    ops = {row["row"]: row["operators"] for row in epoch_report["rows"]}
    classic, mean = ops["rr-classic"], ops["mean"]
    assert classic["eager"] == classic["cuda_path"]  # no sign recursion
    assert classic["eager"]["opt"] == mean["eager"]["opt"]  # the same SGD
    assert mean["eager"]["ordering"] > classic["eager"]["ordering"]
    # CUDA signs 3 operators per example (16) where the CPU runs numpy, plus its 5 set-up ones
    assert mean["cuda_path"]["ordering"] - mean["eager"]["ordering"] == 3 * 16 + 5
    # no sequential signs: only the per-sample check differs, the same in every per-sample row:
    # the loss split (its host read is the CPU's) and the rows' mean judged on the host on the
    # CPU, on the device on CUDA (a captured step, graph_safe, runs no check)
    batch, differ = ops["batch"], mean["eager"]["grads"] - mean["cuda_path"]["grads"]
    assert differ != 0 and batch["eager"]["grads"] - batch["cuda_path"]["grads"] == differ
    for stage in ("gsnr", "ordering", "opt"):
        assert batch["eager"].get(stage) == batch["cuda_path"].get(stage)
    # the graph holds the step's kernels as CUDA runs them (the trace records no pure-metadata
    # operator such as promote_types, which the count of an eager step includes)
    for name in ("rr-classic", "mean", "pair", "recursive"):
        assert 0 < ops[name]["captured"]["kernels"] <= ops[name]["cuda_path"]["total"]
    assert ops["mean"]["captured"]["kernels"] == ops["mean"]["cuda_path"]["total"]
    assert ops["mean:graph"]["captured"] == ops["mean"]["captured"]


def test_captured_rows_time_whole_steps_only(epoch_report):
    rows = {row["row"]: row for row in epoch_report["rows"]}
    graph = rows["mean:graph"]
    assert graph["step_ms"] > 0 and all(v is None for v in graph["breakdown_ms"].values())


def test_epoch_bench_profiles_every_stage_of_every_eager_row(epoch_report):
    rows = {row["row"]: row for row in epoch_report["rows"]}
    assert rows["mean:graph"]["profile"] is None  # a captured step runs as one
    for name in ("rr-classic", "mean", "recursive", "rr+vr_adam"):
        profile = rows[name]["profile"]
        ran = {s for s, ms in rows[name]["breakdown_ms"].items() if ms is not None}
        assert set(profile) == ran
        for stage in profile.values():
            assert stage["other_ms"] >= 0  # no operator counted twice or in the wrong stage
    grads = {name: rows[name]["profile"]["grads"]["ops"] for name in ("rr-classic", "mean")}
    # classic: the convolutions' backward from autograd, one per layer; the per-sample path: one
    # backward too (it owns p.grad, issue 49), whose grouped convolutions over weights copied per
    # example give the per-sample weight gradients and p.grad at once (no second one)
    assert grads["rr-classic"]["aten::convolution_backward"]["calls"] == 2
    assert grads["mean"]["aten::convolution_backward"]["calls"] == 2
    assert "aten::addmm" not in grads["rr-classic"]  # inside aten::linear: its caller's time


def test_operator_times_split_a_stage_into_outermost_operators_and_the_rest():
    x, weight = torch.randn(64, 64), torch.randn(32, 64)

    def step(stage):
        stage("first", lambda: (torch.mm(x, x), torch.mm(x, x), time.sleep(0.004)))
        stage("second", lambda: F.linear(x, weight))

    times = operator_times(step, steps=3)
    assert set(times) == {"first", "second"}
    first = times["first"]
    assert set(first["ops"]) == {"aten::mm"} and first["ops"]["aten::mm"]["calls"] == 2
    assert first["other_ms"] >= 4.0  # the sleep is no operator
    assert first["ops"]["aten::mm"]["ms"] > 0 and first["ms"] >= 4.0
    assert set(times["second"]["ops"]) == {"aten::linear"}  # its addmm is inside it


def test_epoch_bench_refuses_a_negative_profile_step_count_before_any_work(tmp_path):
    out = tmp_path / "epoch.json"
    with pytest.raises(ValueError, match=r"--profile-steps: got -1; allowed: an integer >= 0"):
        epoch.main(["--profile-steps", "-1", "--out", str(out)])
    assert not out.exists()


def test_operator_count_skips_views():
    x = torch.randn(4, 5)
    with OperatorCount() as counter:
        y = x.T @ x[:, :3]  # permute and slice are views: only mm counts
        y.view(-1).relu_()
    assert counter.counts == {"mm": 1, "relu_": 1} and counter.total == 2


def test_epoch_bench_times_the_gsnr_of_vrgd_rows_only(epoch_report):
    for row in epoch_report["rows"]:
        gsnr = row["breakdown_ms"]["gsnr"]
        if "+vr_" in row["row"]:
            assert gsnr > 0 and row["ratio_to_classic_rr"] > 0
        else:
            assert gsnr is None


def test_epoch_bench_peak_memory_holds_the_per_sample_work(epoch_report):
    assert epoch_report["memory_method"] == CPU_METHOD
    per_sample = 16 * LENET_FLOATS * 4  # (B, d) float32, in the pipeline's reused buffer
    peaks = {r["row"]: r["peak_step_bytes"] for r in epoch_report["rows"]}
    classic = peaks.pop("rr-classic")
    assert 0 < classic < per_sample
    assert all(peak > classic for peak in peaks.values())  # the hooks' per-layer work on top
    for row, peak in peaks.items():  # the GSNR reads the rows where they are (factors too):
        if "+vr_" in row:  # within four (d,) vectors of the same row without it
            plain = row.split("+", 1)[0]
            assert peak <= peaks[plain] + 4 * LENET_FLOATS * 4, (row, peak, plain, peaks[plain])


@pytest.fixture(scope="module")
def quick_sweep(tmp_path_factory):
    """The quick sweep at 1 job x 2 threads and 2 jobs x 1 thread, run folders kept."""
    root = tmp_path_factory.mktemp("sweep")
    out = root / "sweep.json"
    settings = ["--settings", "1x2,2x1", "--keep", str(root / "kept")]
    sweep.main(["--quick", *settings, "--out", str(out)])
    return root, json.loads(out.read_text())


@pytest.mark.slow
def test_sweep_quick_mode_reports_throughput_and_threads(quick_sweep):
    _, report = quick_sweep
    assert report["benchmark"] == "sweep"
    assert {"cpu", "cpu_count", "torch", "device"} <= set(report["machine"])
    assert "hydra/launcher=joblib_local" in report["settings"]["command"]
    first, second = report["results"]
    assert (first["setting"], second["setting"]) == ("1x2", "2x1")
    assert first["speedup_vs_sequential"] == 1.0 and second["speedup_vs_sequential"] > 0
    for result in report["results"]:
        assert result["jobs"] == 4  # rows rr, mean x seeds 0, 7
        assert result["jobs_per_hour"] == pytest.approx(4 * 3600 / result["wall_s"])
        assert 0 < result["median_epoch_s"] < result["wall_s"]
        # every job's torch used exactly the setting's threads, whatever this process has,
        # in one process per job slot (1x2: the multirun's own process)
        assert result["torch_threads_seen"] == [result["threads_per_job"]]
        assert result["processes"] == result["n_jobs"]
        assert math.isfinite(result["max_abs_loss_diff_vs_sequential"])


@pytest.mark.slow
def test_joblib_and_basic_launchers_give_identical_metrics(quick_sweep, tmp_path):
    root, _ = quick_sweep
    joblib_root = root / "kept" / "2x1"  # joblib, 2 jobs at once in 2 worker processes
    args = [
        "-m",
        "experiment=table1",
        f"row={sweep.QUICK['rows']}",
        f"seed={sweep.QUICK['seeds']}",
    ]
    args += ["epochs=1", "progress=none", *sweep.QUICK_OVERRIDES]  # the basic launcher
    done = run_grab(args, tmp_path, grab_env(tmp_path, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stdout
    basic_root = tmp_path / "outputs" / "table1"
    basic = {d.relative_to(basic_root): computed(read_rows(d)[1]) for d in run_dirs(tmp_path)}
    joblib = {
        p.parent.relative_to(joblib_root): computed(read_rows(p.parent)[1])
        for p in joblib_root.rglob("metrics.csv")
    }
    assert len(basic) == 4 and basic == joblib


def test_projection_bench_short_mode_writes_json(tmp_path):
    from grab_exp.bench import projection

    out = tmp_path / "projection.json"
    projection.main(["--quick", "--out", str(out)])
    report = json.loads(out.read_text())
    assert report["benchmark"] == "projection"
    assert {"cpu", "torch", "torch_threads", "device"} <= set(report["machine"])
    assert report["settings"]["d"] == 49_338 and report["settings"]["k"] == 256
    assert set(report["grads_ms"]) == {"factored", "hooks"} and report["memory_method"]
    assert report["materialize_ms"] > 0
    assert [(r["variant"], r["projection_kind"]) for r in report["rows"]] == [
        (v, kind) for v in ("mean", "recursive") for kind in (None, "rademacher", "countsketch")
    ]
    for row in report["rows"]:
        assert set(row) == {
            "variant",
            "projection_dim",
            "projection_kind",
            "method",
            "step_ms",
            "state_bytes",
            "step_peak_bytes",
            "scratch_bytes",
            "step_ratio",
            "state_ratio",
        }
        assert row["step_ms"] > 0 and row["state_bytes"] > 0 and row["step_peak_bytes"] >= 0
        sketched = row["projection_dim"] is not None
        assert row["method"] == ("hooks" if sketched else "factored")  # a sketch materializes
        assert (row["state_ratio"] < 0.1) == sketched and (row["state_ratio"] == 1) != sketched


@pytest.mark.parametrize("balance", ["mean", "pair", "batch"])
def test_a_factored_step_allocates_far_less_than_the_per_sample_matrix(balance):
    """The memory claim of ``bench rss``, as allocations: a factored step of mean / pair / batch
    never forms a (B, d) matrix (the materialized path keeps one reused buffer of that size)."""
    torch.manual_seed(0)
    model, batch = MLP(hidden=(256,)), 16
    d = sum(p.numel() for p in model.parameters())  # 789,258
    pipeline = PerSamplePipeline(model, F.cross_entropy, method="factored")
    sampler = GraBSampler(64, d, balance=balance)
    parts = StepParts(model, torch.optim.SGD(model.parameters(), lr=0.1), pipeline, sampler)
    x, y = torch.randn(batch, 3, 32, 32), torch.randint(0, 10, (batch,))

    def step():
        start = sampler.pos
        train_step(parts, x, y, sampler.order[start : start + batch])

    assert peak_step_bytes(step, CPU) < batch * d * 4 / 8
    assert pipeline.per_sample.grad_buffer.buffer is None


# ---------------------------------------------------------------- the command lines


@pytest.mark.parametrize("name", list(BENCHMARKS))
def test_every_bench_writes_under_report_bench_by_default_and_documents_its_options(name):
    """Default output outside results/ (the committed reports), one ``--out``, help for all."""
    parser = BENCHMARKS[name].build_parser()
    defaults = parser.parse_args([])
    out = Path(defaults.out)
    assert out == Path("report") / "bench" / f"{name}.json"
    assert "results" not in out.parts
    options = [a for a in parser._actions if a.help != argparse.SUPPRESS]
    assert "--json" not in {s for a in options for s in a.option_strings}
    undocumented = [a.option_strings for a in options if not a.help]
    assert not undocumented, f"{name}: options without help text: {undocumented}"
    assert parser.description


def test_bench_help_lists_every_benchmark_and_exits_0():
    done = subprocess.run(
        [sys.executable, "-m", "grab_exp.bench", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    listed = [line.split()[0] for line in done.stdout.splitlines() if line.startswith("  ")]
    assert listed == list(BENCHMARKS)


def test_the_per_sample_benchmark_times_every_method_against_the_plain_step(tmp_path):
    from grab_exp.bench import per_sample

    out = tmp_path / "per_sample.json"
    rows = per_sample.main(["--models", "lenet", "--repeats", "2", "--out", str(out)])
    (row,) = rows
    assert set(row["ms"]) == {"plain", "auto:factored", "func", "loop"} and not row["refused"]
    assert row["over_plain"]["plain"] == 1.0 and row["parameters"] == 62_006
    assert json.loads(out.read_text())["rows"] == rows
    with pytest.raises(SystemExit):
        per_sample.main(["--models", "vgg", "--out", str(out)])
    args = ["--models", "lenet", "--repeats", "2", "--unchecked", "--out", str(out)]
    (row,) = per_sample.main(args)
    unchecked = {"auto:factored@unchecked", "func@unchecked"}
    assert set(row["ms"]) == {"plain", "auto:factored", "func", "loop"} | unchecked
    args = ["--models", "lenet", "--repeats", "2", "--methods", "auto", "--out", str(out)]
    (row,) = per_sample.main(args)
    assert set(row["ms"]) == {"plain", "auto:factored"}
    with pytest.raises(SystemExit):
        per_sample.main([*args[:-2], "--methods", "auto,vmap", "--out", str(out)])


def test_each_per_sample_step_of_the_benchmark_starts_from_no_grad():
    """Like the plain step (``zero_grad(set_to_none=True)``), so that neither is timed adding
    into a ``param.grad`` that grows call after call."""
    from grab_exp.bench import per_sample

    make, batch, loss_fn = per_sample.MODELS["lenet"]
    x, y = batch(torch.Generator().manual_seed(0))
    steps = per_sample._methods(make(), loss_fn, x, y, methods_timed=("auto",))
    psg_step = steps["auto:factored"]
    psg = psg_step.args[0]
    for _ in range(2):
        psg_step()
        once = [p.grad.clone() for p in psg.model.parameters()]
    psg.model.zero_grad(set_to_none=True)
    psg(x, y)
    for a, b in zip(once, (p.grad for p in psg.model.parameters()), strict=True):
        torch.testing.assert_close(a, b)


def test_a_killed_epoch_bench_leaves_a_file_the_report_reads(tmp_path):
    """The file is rewritten (atomically) after every timed repeat: a time limit that kills the
    bench leaves Table 1's times for the report."""
    out = tmp_path / "epoch.json"
    args = ["--steps", "1", "--warmup", "1", "--repeats", "100000", "--captured", "no"]
    bench = subprocess.Popen(
        [sys.executable, "-m", "grab_exp.bench", "epoch", *args, "--out", str(out)],
        stdout=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    try:
        deadline = time.monotonic() + 120
        while not out.exists() and time.monotonic() < deadline and bench.poll() is None:
            time.sleep(0.2)
        time.sleep(1.0)  # a few more repeats, each rewriting the file
    finally:
        bench.kill()
        bench.wait()
    report = json.loads(out.read_text())
    assert not report["complete"] and report["done"][-1].startswith("timing ")
    assert all(r["peak_step_bytes"] is None for r in report["rows"])  # not measured yet
    times = read_epoch_bench(out).rows
    assert len(times) == len(ROWS) and (times["step_ms"] > 0).all()


def test_the_state_bench_adds_up_the_training_state_of_every_table1_row(tmp_path):
    out = tmp_path / "state.json"
    rows = state.main(["--warmup", "1", "--method", "hooks", "--out", str(out)])
    assert json.loads(out.read_text())["rows"] == rows
    assert [r["row"] for r in rows] == [row_name(v, p) for v, p in ROWS]
    weights = 62_006 * 4  # LeNet's float32 parameters
    for r in rows:
        classic = r["row"] == "rr-classic"
        assert r["model"] == r["gradients"] == r["optimizer"] == weights  # SGD's momentum
        assert r["per_sample"] == (0 if classic else 16 * weights)  # hooks: the (B, d) buffer
        assert r["step_peak"] > 0
        assert r["total"] == sum(r[part] for part in state.PARTS)
    orderings = {r["row"]: r["ordering"] for r in rows}
    assert orderings["rr"] == 2 * 50_000 * 8  # order and keys, int64
    assert orderings["recursive"] > orderings["mean"] > orderings["rr"]


def test_the_load_average_is_read_when_the_benchmark_starts(monkeypatch):
    """Not after the measuring, when it is mostly the benchmark's own load."""
    from grab_exp.bench import machine

    loads = iter([(0.25, 0, 0), (1.75, 0, 0)])  # the OS's answers: at the start, then later
    monkeypatch.setattr(machine.os, "getloadavg", lambda: next(loads))
    machine.bench_parser("epoch", "A benchmark.")
    assert machine.describe_machine(CPU)["load_avg_1m"] == 0.25


def test_the_vrgd_bench_times_the_arms_that_hydra_composes(compose):
    """``bench vrgd``'s arms are read from conf/: each one's pipeline and optimizer are what
    ``experiment=vrgd_large_batch arm=<arm>`` trains with, in the sweep's order."""
    from grab_exp.bench.vrgd import ARMS

    cfg = compose(["experiment=vrgd_large_batch"], hydra=True)
    assert list(ARMS) == str(cfg.hydra.sweeper.params.arm).split(",")
    for arm, (pipeline, optimizer) in ARMS.items():
        choices = compose(["experiment=vrgd_large_batch", f"arm={arm}"], hydra=True)
        chosen = choices.hydra.runtime.choices
        assert (chosen["pipeline"], chosen["optimizer"]) == (pipeline, optimizer), arm


def test_every_row_key_is_its_run_directory_name(compose):
    """The bench's, the report's and the run directories' key of a row are one rule."""
    from grab_exp.report.table1_table import ROW_ORDER

    for variant, pipeline in ROW_ORDER:
        row = variant_dir(variant, pipeline).replace("-", "_")
        cfg = compose(["experiment=table1", f"row={row}"], hydra=True)
        with hydra_config_of(cfg):
            run_dir = Path(cfg.hydra.run.dir)
        assert run_dir.parent.name == variant_dir(variant, pipeline) == row_name(variant, pipeline)


@pytest.mark.parametrize("row", ["rr_classic", "mean", "recursive", "recursive_pair"])
def test_a_bench_row_is_built_as_its_training_job(row):
    """``bench epoch`` builds a row from the configs that ``experiment=table1 row=<row>``
    composes, through the runner's build: same model weights, ordering and its options,
    optimizer settings and pipeline, so a change under conf/ reaches both."""
    from grab_exp.report.table1_table import ROW_ORDER

    variant, pipeline = next(r for r in ROW_ORDER if variant_dir(*r).replace("-", "_") == row)
    settings = argparse.Namespace(batch=16, method="auto")
    bench = epoch.build_row(variant, pipeline, settings, CPU)
    job = compose_job([f"row={row}", "model=lenet", "seed=0", "batch_size=16"]).parts
    assert type(bench.step.ordering) is type(job.ordering)
    for key in ("depth", "batch_size"):  # recursive's, recursive_pair's
        assert getattr(bench.step.ordering, key, None) == getattr(job.ordering, key, None), key
    assert type(getattr(bench.step.ordering, "kernel", None)) is type(
        getattr(job.ordering, "kernel", None)
    )
    assert bench.step.optimizer.defaults == job.optimizer.defaults
    assert type(bench.step.pipeline) is type(job.pipeline)
    assert getattr(bench.step.pipeline, "method", None) == getattr(job.pipeline, "method", None)
    bench_weights, job_weights = bench.step.model.state_dict(), job.model.state_dict()
    assert all(torch.equal(bench_weights[k], job_weights[k]) for k in job_weights)
