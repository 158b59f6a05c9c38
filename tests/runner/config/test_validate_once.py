"""A job's config is validated and fingerprinted once, on its way from the command line to
training: Hydra's callback checks it before anything is written, and the job reuses that check.
"""

from __future__ import annotations

import json

import pytest
from support.grab_run import run_in_process

from grab_exp.runner.config import check as config_check
from grab_exp.runner.config import fingerprint

SMOKE = ("experiment=smoke", "epochs=1", "progress=none")


@pytest.fixture
def counted(monkeypatch):
    """Counts of whole-config validations and fingerprints made while the test runs."""
    counts = {"validations": 0, "fingerprints": 0}
    first_check = config_check.CHECKS[0]

    def counting_check(cfg):
        counts["validations"] += 1
        return first_check(cfg)

    flatten = fingerprint._flatten

    def counting_flatten(node, prefix, out):
        counts["fingerprints"] += prefix == ""  # the top-level call of one fingerprint
        return flatten(node, prefix, out)

    monkeypatch.setattr(config_check, "CHECKS", (counting_check, *config_check.CHECKS[1:]))
    monkeypatch.setattr(fingerprint, "_flatten", counting_flatten)
    return counts


def _grab_exp(tmp_path, *args: str) -> None:
    """``python -m grab_exp *args`` in this process (the counters see it), in ``tmp_path``."""
    done = run_in_process(args, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]


def _status(run_dir) -> str:
    return json.loads((run_dir / "summary.json").read_text())["status"]


def test_a_single_run_validates_and_fingerprints_its_config_once(tmp_path, counted):
    """The callback validates and fingerprints; the job trains on its check."""
    run_dir = tmp_path / "run"
    _grab_exp(tmp_path, *SMOKE, f"hydra.run.dir={run_dir}")
    assert _status(run_dir) == "finished"
    assert counted == {"validations": 1, "fingerprints": 1}


def test_each_job_of_a_sweep_is_validated_once(tmp_path, counted):
    """The sweep checks every job before any starts; each job (basic launcher, in this
    process) trains on that check."""
    sweep_dir = tmp_path / "sweep"
    _grab_exp(tmp_path, "-m", *SMOKE, "seed=1,2", f"hydra.sweep.dir={sweep_dir}")
    assert [_status(d) for d in sorted(sweep_dir.glob("*/seed*"))] == ["finished"] * 2
    assert counted == {"validations": 2, "fingerprints": 2}


def test_a_job_nothing_checked_validates_itself(tmp_path, counted):
    """A caller that skips Hydra's callback (here the runner called directly) is still checked:
    a bad value is refused before any work."""
    from support.grab_run import run_job_here

    from grab_exp.runner.config.schema import ConfigError

    with pytest.raises(ConfigError, match="batch_size"):
        run_job_here(["experiment=smoke", "batch_size=0"], tmp_path / "run")
    assert counted["validations"] == 1
    assert not (tmp_path / "run").exists()
