"""The scripts in examples/ run end to end (a few steps each) and print GraB beside random
reshuffling, epoch by epoch."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.grab_run import OFFLINE_ENV

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
EPOCH_LINE = re.compile(r"^\s+(\d+)\s+(\d+\.\d{4})\s+(\d+\.\d{4})$", re.M)


def run_example(script: str, *args: str) -> str:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script), *args],
        capture_output=True, text=True, timeout=600, env=env, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    ("script", "args", "method"),
    [
        ("lstm_language_model.py", ["--examples", "32"], "factored"),
        ("transformer_classifier.py", ["--examples", "32", "--attention-dropout", "0"], "factored"),
        ("transformer_classifier.py", ["--examples", "16", "--balance", "pair"], "func"),
    ],
)
def test_a_sequence_example_prints_grab_beside_rr(script, args, method):
    out = run_example(script, "--epochs", "2", *args)
    assert f"per-sample gradients by method '{method}'" in out
    epochs = EPOCH_LINE.findall(out)
    assert [int(e) for e, _, _ in epochs] == [1, 2]
    # the same seed: the first epoch is the same random permutation for both orderings
    assert epochs[0][1] == epochs[0][2]


@pytest.mark.slow
@pytest.mark.parametrize("data", ["--synthetic", "--archive"])
def test_the_resnet_example_trains_with_groupnorm(data):
    if data == "--archive" and not ARCHIVE.exists():
        pytest.skip(f"needs the CIFAR-10 archive at {ARCHIVE}")
    source = [data, str(ARCHIVE)] if data == "--archive" else [data]
    out = run_example(
        "resnet_groupnorm.py", "--epochs", "1", "--examples", "16", "--batch-size", "8", *source
    )
    assert "per-sample gradients by method 'factored'" in out
    assert len(EPOCH_LINE.findall(out)) == 1


def test_the_resnet_example_offline_without_data_says_what_to_do_in_one_line(tmp_path):
    env = {**os.environ, **OFFLINE_ENV, "XDG_CACHE_HOME": str(tmp_path)}  # no CIFAR-10 cached
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "resnet_groupnorm.py"), "--epochs", "1"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: dataset=cifar10: CIFAR-10 is not in")
    assert lines[0].endswith("offline: rerun with --archive PATH or --synthetic")
    assert not list(tmp_path.glob("*.png"))


def test_bad_arguments_fail_in_one_line():
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "lstm_language_model.py"), "--epochs", "0"],
        capture_output=True, text=True, timeout=120, cwd=ROOT, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "--epochs must be >= 1" in done.stderr
