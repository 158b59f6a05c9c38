"""A job's config is composed, validated and fingerprinted once, on its way from the command line
to training: Hydra's callback (or the sweep) checks it before anything is written, and the job
trains on that config and reuses that check.
"""

from __future__ import annotations

import json
import pickle

import pytest
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from support.grab_run import compose_config, run_in_process

from grab_exp.runner.config import check as config_check
from grab_exp.runner.config import fingerprint
from grab_exp.runner.launch import override_keys

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


@pytest.fixture
def composed(monkeypatch):
    """Counts of compositions while the test runs: Hydra's of a whole config (``config``: its
    mode check, then the run's or the sweep's, and every sweep job's), of each sweep job
    (``job``), and grab_exp's own (``ours``)."""
    counts = {"config": 0, "job": 0, "ours": 0}

    def counting(method, key):
        def count(*args, **kwargs):
            counts[key] += 1
            return method(*args, **kwargs)

        return count

    for owner, name, key in (
        (ConfigLoaderImpl, "load_configuration", "config"),
        (ConfigLoaderImpl, "load_sweep_config", "job"),
        (override_keys, "compose_config", "ours"),
    ):
        monkeypatch.setattr(owner, name, counting(getattr(owner, name), key))
    return counts


def _grab_exp(tmp_path, *args: str) -> None:
    """``python -m grab_exp *args`` in this process (the counters see it), in ``tmp_path``."""
    done = run_in_process(args, tmp_path)
    assert done.returncode == 0, done.stdout[-3000:]


def _status(run_dir) -> str:
    return json.loads((run_dir / "summary.json").read_text())["status"]


def test_a_single_run_composes_validates_and_fingerprints_its_config_once(
    tmp_path, counted, composed
):
    """Hydra composes the config (its mode check, then the run: Hydra's own two), grab_exp
    composes none of its own (every key of the command is known without composing); the
    callback validates and fingerprints; the job trains on its check."""
    run_dir = tmp_path / "run"
    _grab_exp(tmp_path, *SMOKE, "optimizer.lr=0.01", f"hydra.run.dir={run_dir}")
    assert _status(run_dir) == "finished"
    assert counted == {"validations": 1, "fingerprints": 1}
    assert composed == {"config": 2, "job": 0, "ours": 0}


def test_each_job_of_a_sweep_is_composed_and_validated_once(tmp_path, counted, composed):
    """The sweep composes and checks every job before any starts; each job (basic launcher, in
    this process) trains on that config and that check."""
    sweep_dir = tmp_path / "sweep"
    _grab_exp(tmp_path, "-m", *SMOKE, "seed=1,2", f"hydra.sweep.dir={sweep_dir}")
    assert [_status(d) for d in sorted(sweep_dir.glob("*/seed*"))] == ["finished"] * 2
    assert counted == {"validations": 2, "fingerprints": 2}
    # Hydra's mode check and the sweep's own config, then one per job (a job's composition is
    # a load_configuration too); before the launcher took the checked configs: 7 and 4
    assert composed == {"config": 4, "job": 2, "ours": 0}


class HydrasLoader:
    """Stands for Hydra's config loader: what it composes is told apart from a checked config."""

    def load_sweep_config(self, master, overrides):
        return ("composed by Hydra", overrides)


def test_a_joblib_worker_gets_its_jobs_checked_config(tmp_path, monkeypatch):
    """What a joblib task carries (pickled, one job's check only) hands the worker the job's
    config as the sweep composed it and keeps its fingerprint for the job, so the worker
    neither composes nor validates it again; another job's config is Hydra's to compose."""
    from grab_exp.runner.launch.checks import run_dir_of
    from grab_exp.runner.launch.sweeper import CheckedJobs

    monkeypatch.chdir(tmp_path)
    config = compose_config(["experiment=smoke", "seed=3"], hydra=True)
    fingerprint_of = {"config": {"seed": 3}}

    loader = CheckedJobs(HydrasLoader(), {("seed=3",): (config, fingerprint_of), ("seed=4",): None})
    task = pickle.loads(pickle.dumps(loader.only(["seed=3"])))
    assert list(task.checked) == [("seed=3",)]
    assert task.load_sweep_config(None, ["seed=3"]) == config
    kept = config_check.take_checked(run_dir_of(config), config.hydra.overrides.task)
    assert kept == fingerprint_of
    assert task.load_sweep_config(None, ["seed=3"]) == ("composed by Hydra", ["seed=3"])


def test_a_job_nothing_checked_validates_itself(tmp_path, counted):
    """A caller that skips Hydra's callback (here the runner called directly) is still checked:
    a bad value is refused before any work."""
    from support.grab_run import run_job_here

    from grab_exp.runner.config.schema import ConfigError

    with pytest.raises(ConfigError, match="batch_size"):
        run_job_here(["experiment=smoke", "batch_size=0"], tmp_path / "run")
    assert counted["validations"] == 1
    assert not (tmp_path / "run").exists()


def test_only_local_launchers_train_on_the_sweeps_check():
    """The basic launcher and ``joblib_local`` run their jobs here, so they train on the sweep's
    check; a job that SLURM or a plugin's own launcher runs is validated where it trains."""
    from hydra._internal.core_plugins.basic_launcher import BasicLauncher
    from hydra_plugins.hydra_joblib_launcher.joblib_launcher import JoblibLauncher
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

    from grab_exp.runner.launch.joblib_launcher import JoblibLocalLauncher
    from grab_exp.runner.launch.sweeper import takes_checked

    local, remote = (BasicLauncher, JoblibLocalLauncher), (JoblibLauncher, SlurmLauncher)
    assert all(takes_checked(object.__new__(cls)) for cls in local)
    assert not any(takes_checked(object.__new__(cls)) for cls in remote)
