"""``scripts/gpu_check.sh``: its bad input, the device tool's limits on what it returns, and its
CPU rehearsal (``--rehearse``) end to end: the GPU image's packages only, the bundle installed
the way the GPU machine installs it, every check run with ``device=cpu``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch
from support.grab_run import REPO_ROOT

SCRIPT = REPO_ROOT / "scripts" / "gpu_check.sh"
LIMITS = [sys.executable, str(REPO_ROOT / "scripts" / "gpu_rehearsal.py"), "limits"]
CHECKS = [
    "torch_apis",
    "gpu_tests",
    "epoch_bench",
    "cifar10_cache",
    "table1",
    "table1_report",
    "compile_tests",
]
RETURNED = ["bench_epoch.json", "checks.txt", "gpu_check.tar.gz", "junit.xml"]
MIB = 2**20
#: what gpu_prepare.sh copies into data/ when the tree has none yet
ARCHIVES = [
    REPO_ROOT / "data" / "cifar10-jpeg.tar.gz",
    REPO_ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz",
]


def _run(args: list[str], timeout: float = 60, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, capture_output=True, text=True, timeout=timeout, env={**os.environ, **env}
    )


@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        ([], {"OUT": ""}, "error: OUTPUT_DIR: got nothing; allowed: a folder"),
        (["OUT_DIR"], {"GRAB_ARCHIVE": "/nonexistent.tar.gz"}, "error: GRAB_ARCHIVE: got '/non"),
        (["OUT_DIR"], {"GPU_CHECK_TIME_SCALE": "fast"}, "error: GPU_CHECK_TIME_SCALE: got 'fast'"),
    ],
)
def test_bad_input_is_one_line_before_any_work(tmp_path, args, env, message):
    out = tmp_path / "out"
    archive = {"GRAB_ARCHIVE": str(tmp_path / "archive.tar.gz")}
    (tmp_path / "archive.tar.gz").write_bytes(b"")
    argv = ["bash", str(SCRIPT), *[str(out) if a == "OUT_DIR" else a for a in args]]
    result = _run(argv, **{**archive, **env})
    assert result.returncode == 2
    assert result.stderr.startswith(message) and result.stderr.count("\n") == 1
    assert not out.exists()


@pytest.mark.parametrize(
    ("layout", "problem"),
    [
        ({f"f{i}.txt": 1 for i in range(9)}, "9 files (at most 8)"),
        ({"big.bin": 16 * MIB + 1}, "big.bin: 16777217 bytes"),
        ({"a/b/c/deep.txt": 1}, "a/b/c/deep.txt: over 2 folders down"),
        ({"odd name.txt": 1}, "odd name.txt: a link or a name outside"),
    ],
)
def test_the_limits_check_refuses_what_would_not_come_back(tmp_path, layout, problem):
    for name, size in layout.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x" * size)
    result = _run([*LIMITS, str(tmp_path)])
    assert result.returncode == 1 and problem in result.stderr
    (tmp_path / "ok").mkdir()
    (tmp_path / "ok" / "a").mkdir()
    (tmp_path / "ok" / "a" / "fits.txt").write_text("x")
    assert _run([*LIMITS, str(tmp_path / "ok")]).returncode == 0


def _checks(out: Path) -> dict[str, str]:
    lines = (out / "checks.txt").read_text().splitlines()
    return {line.split()[0]: line for line in lines if not line.startswith("#")}


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("GRAB_REHEARSAL") != "1",
    reason="the full CPU rehearsal (70-80 s, the longest test) runs with GRAB_REHEARSAL=1: "
    "before a device check and after a change to scripts/gpu_*; CI's budget leaves it out",
)
@pytest.mark.skipif(
    not any(path.is_file() for path in ARCHIVES),
    reason=f"CIFAR-10 JPEG archive absent: {ARCHIVES[1]} (the rehearsal's Table 1 check needs it)",
)
def test_the_cpu_rehearsal_runs_every_check_and_returns_files_within_the_limits(tmp_path):
    out = tmp_path / "out"
    result = _run(["bash", str(SCRIPT), "--rehearse", str(out)], 900, PYTHON=sys.executable)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert sorted(p.name for p in out.iterdir()) == RETURNED
    assert all(p.stat().st_size < 16 * MIB for p in out.iterdir())
    checks = _checks(out)
    assert list(checks) == CHECKS
    assert all(line.split()[1] == "ok" for line in checks.values()), checks
    assert "# total " in (out / "checks.txt").read_text()
    suites = {s.get("name"): s for s in ET.parse(out / "junit.xml").getroot()}
    assert sorted(suites) == ["compile_tests", "gpu_tests", "torch_apis"]
    assert (
        int(suites["torch_apis"].get("tests")) > 40 and suites["torch_apis"].get("failures") == "0"
    )
    with tarfile.open(out / "gpu_check.tar.gz") as archive:
        names = archive.getnames()
    assert not [n for n in names if n.endswith(".pt")]  # no checkpoints
    assert {f"logs/{name}.log" for name in CHECKS} <= set(names)
    assert len([n for n in names if n.endswith("metrics.csv")]) == 7  # Table 1's 7 rows
    assert "runs/report/table1.md" in names


PROBE = [sys.executable, str(REPO_ROOT / "scripts" / "gpu_probe.py")]


def test_the_probe_rehearsal_answers_every_ordering_and_kernel(tmp_path):
    from grab_exp.balance import Ordering

    result = _run([*PROBE, "--device", "cpu", "--rehearse", "--out", str(tmp_path)], 300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    lines = [json.loads(line) for line in (tmp_path / "probe.jsonl").read_text().splitlines()]
    assert lines[0]["probe"] == "versions" and lines[-1]["probe"] == "compile"
    captures = {(line["ordering"], line["kernel"]): line for line in lines[1:-1]}
    expected = {
        (name, kernel)
        for name, cls in Ordering.choices().items()
        for kernel in (["deterministic", "probabilistic"] if cls.needs_grads else [None])
    }
    assert set(captures) == expected and all(line["ok"] for line in lines)
    for line in captures.values():  # the CPU replays a trace: bit for bit
        assert line["orders_equal"] and line["max_loss_diff"] == line["max_param_diff"] == 0
        assert line["eager_step_ms"] > 0 and line["replay_step_ms"] > 0
    assert lines[-1]["cold_compile_s"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: --device cuda is valid")
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--device", "cuda", "--out", "OUT"], "error: --device: got 'cuda'; allowed: cpu (no GPU"),
        (["--device", "cpu"], "error: --out: got nothing; allowed: a folder"),
    ],
)
def test_the_probe_refuses_bad_input_in_one_line(tmp_path, args, message):
    args = [str(tmp_path / a) if a == "OUT" else a for a in args]
    result = _run([*PROBE, *args], OUT="")
    assert result.returncode == 2 and result.stderr.startswith(message)
    assert result.stderr.count("\n") == 1 and not (tmp_path / "OUT").exists()


def _ignoring_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell's background job starts


def test_the_checks_commands_stop_on_sigint_even_when_started_with_it_ignored():
    """gpu_check.sh runs each check through ``gpu_rehearsal.py with-sigint``: a command that
    inherited an ignored SIGINT would outlive timeout's SIGINT until the SIGKILL 20 s later."""
    show = [sys.executable, "-c", "import signal; print(signal.getsignal(signal.SIGINT))"]
    plain = subprocess.run(show, capture_output=True, text=True, preexec_fn=_ignoring_sigint)
    assert plain.stdout.strip() in ("1", "Handlers.SIG_IGN")  # SIG_IGN: what the check inherits
    wrapped = subprocess.run(
        [*LIMITS[:2], "with-sigint", *show],
        capture_output=True,
        text=True,
        preexec_fn=_ignoring_sigint,
    )
    assert wrapped.stdout.strip() == "<built-in function default_int_handler>"
    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    timed = ["timeout", "--signal=INT", "--kill-after=60", "2", *LIMITS[:2], "with-sigint"]
    result = subprocess.run([*timed, *sleeper], preexec_fn=_ignoring_sigint, timeout=60)
    assert result.returncode == 124  # stopped by the SIGINT (137: only the SIGKILL stopped it)
