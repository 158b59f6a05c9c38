"""Adding an ordering is one Python module plus one YAML file: trained and reported unchanged.

A toy ordering, ``reverse`` (each epoch the previous order reversed), lives in a temporary
module beside its ``conf/balance/reverse.yaml`` in a temporary config folder; ``python -m
grab_exp`` trains it (with ``rr`` beside it, one multirun) and ``python -m grab_exp.report
table1`` reads it back. No file of the repository changes.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pandas as pd
import pytest
import torch
from support.grab_run import REPO_ROOT, cli_env, run_grab

MODULE = '''
"""A toy ordering: every epoch the previous one's order reversed."""

from grab_exp.balance import Ordering


class ReverseOrder(Ordering):
    """``reverse``: epoch e + 1 visits epoch e's order backwards (no gradients)."""

    name = "reverse"
    needs_grads = False

    def _next_order(self):
        return self.order.flip(-1)
'''
YAML = """\
# Each epoch the previous epoch's order reversed (a toy ordering of the tests).
_target_: reverse_order.ReverseOrder  # ordering class
_partial_: true                        # n, d, seed, device are filled in by the runner
first_epoch: random                    # epoch-0 order: random (seeded) | identity
"""


def repo_state() -> str:
    """Tracked and untracked-not-ignored files that differ from HEAD, with their contents."""
    status = ["git", "status", "--porcelain", "--untracked-files=all"]
    listed = subprocess.run(status, cwd=REPO_ROOT, capture_output=True, text=True, check=True)
    diff = subprocess.run(["git", "diff"], cwd=REPO_ROOT, capture_output=True, text=True)
    return listed.stdout + diff.stdout


@pytest.mark.slow
def test_a_new_ordering_is_one_module_and_one_yaml(tmp_path):
    before = repo_state()
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "reverse_order.py").write_text(MODULE)
    (tmp_path / "conf" / "balance").mkdir(parents=True)
    (tmp_path / "conf" / "balance" / "reverse.yaml").write_text(YAML)
    path = os.pathsep.join([str(tmp_path / "toy"), os.environ.get("PYTHONPATH", "")])
    env = cli_env(PYTHONPATH=path, OMP_NUM_THREADS="1")
    args = [
        "-m",
        "experiment=smoke",
        "balance=reverse,rr",
        "progress=none",
        "device=cpu",
        "dataset.num_train=128",
        "dataset.num_test=32",
        f"hydra.searchpath=[file://{tmp_path / 'conf'}]",
    ]
    done = run_grab(args, tmp_path, env)
    assert done.returncode == 0, done.stdout
    runs = sorted(path.parent for path in (tmp_path / "outputs").rglob("summary.json"))
    assert [run.parent.name for run in runs] == ["reverse", "rr"], runs
    state = torch.load(runs[0] / "checkpoint.pt", weights_only=False)["ordering"]
    assert state["variant"] == "reverse" and state["epoch"] == 1  # the second epoch's order
    first = torch.randperm(128, generator=torch.Generator().manual_seed(0))  # seed 0, epoch 0
    assert torch.equal(state["order"], first.flip(0))

    report = subprocess.run(
        [sys.executable, "-m", "grab_exp.report", "table1", str(tmp_path / "outputs"),
         "--out", str(tmp_path / "table1"), "--no-paper"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert report.returncode == 0, report.stderr
    table = pd.read_csv(tmp_path / "table1" / "table1.csv")
    assert "Reverse" in table["label"].tolist(), table
    assert repo_state() == before
