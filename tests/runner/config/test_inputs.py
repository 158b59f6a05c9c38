"""Bad input: every rule fails before any data loads, in one line naming the key and the
allowed values, both from the validator and as the user sees it from ``python -m grab_exp``.

Each case is checked twice: in-process, ``run_job`` raises ``ConfigError`` while the data
loader and the job builder are booby-trapped (so validation provably comes first); and in a
real subprocess from an empty working directory, whose stderr must be exactly one
``error: ...`` line (with and without ``HYDRA_FULL_ERROR``), exit status 1, and no run files.
"""

from __future__ import annotations

import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from hydra.errors import ConfigCompositionException, InstantiationException
from support.grab_run import OFFLINE_ENV, compose_config, run_cli
from support.run_files import run_artifacts

from grab_exp.__main__ import user_error_line
from grab_exp.balance import Ordering
from grab_exp.data import load_cifar10
from grab_exp.runner.config.check import ConfigError, validate_config
from grab_exp.runner.launch.override_keys import unknown_key_error, wrong_type_error
from grab_exp.runner.training import job as run_module

# a tiny synthetic run: if validation ever let a bad case through, it would end in seconds
TINY = ["dataset=synthetic", "dataset.num_train=64", "dataset.num_test=32", "epochs=1"]
CLI_TIMEOUT_S = 120


@dataclass(frozen=True)
class Case:
    """A bad input: its overrides, the key the error must name, and the allowed values."""

    id: str
    overrides: list[str]
    key: str
    allowed: str
    base: list[str] = field(default_factory=lambda: list(TINY))

    @property
    def args(self) -> list[str]:
        """The command's overrides (quiet progress unless the case sets its own)."""
        quiet = [] if any(o.startswith("progress=") for o in self.overrides) else ["progress=none"]
        return [*self.base, *self.overrides, *quiet]


GRAD_FREE = ", ".join(sorted(n for n, c in Ordering.choices().items() if not c.needs_grads))
CASES = [
    # cross-field rules
    Case(
        "recursive_pair_batch_12",
        ["balance=recursive_pair", "batch_size=12"],
        "batch_size: got 12",
        "a power of two",
    ),
    Case(
        "recursive_pair_batch_mismatch",
        ["balance=recursive_pair", "balance.batch_size=8"],
        "balance.batch_size: got 8",
        "the run's batch_size",
    ),
    Case(
        "cd_grab_without_workers",
        ["balance=cd_grab"],
        "balance: got 'cd_grab'",
        "(or distributed=true for a data-parallel ordering)",
    ),
    Case(
        "mean_with_classic",
        ["balance=mean", "pipeline=classic"],
        "pipeline: got 'classic'",
        f"a balance of: {GRAD_FREE}",
    ),
    Case(
        "missing_archive",
        ["dataset=cifar10_jpeg", "dataset.archive=/nonexistent.tar.gz", "epochs=1"],
        "dataset.archive: no CIFAR-10 JPEG archive at /nonexistent.tar.gz",
        "expected a .tar.gz or a folder",
        base=[],
    ),
    # the ordering's options
    Case(
        "unknown_kernel",
        ["balance.kernel=gaussian"],
        "balance.kernel",
        "deterministic, probabilistic",
    ),
    Case(
        "c_zero",
        ["balance.kernel=probabilistic", "balance.c=0"],
        "balance.c: got 0",
        "a number > 0",
    ),
    Case("c_negative", ["balance.c=-1.5"], "balance.c: got -1.5", "a number > 0"),
    Case(
        "depth_negative",
        ["balance=recursive", "balance.depth=-1"],
        "balance.depth",
        "an integer >= 0",
    ),
    Case("bad_dtype", ["balance.dtype=float16"], "balance.dtype", "float32, float64"),
    # the run's own settings
    Case("epochs_zero", ["epochs=0"], "epochs: got 0", "an integer >= 1"),
    Case("batch_size_zero", ["batch_size=0"], "batch_size: got 0", "an integer >= 1"),
    Case("eval_batch_size_zero", ["eval_batch_size=0"], "eval_batch_size", "an integer >= 1"),
    Case("seed_negative", ["seed=-1"], "seed: got -1", "an integer >= 0"),
    Case("bad_device", ["device=gpu"], "device: got 'gpu'", "auto, cpu, cuda, cuda:<k>"),
    Case("bad_progress", ["progress=fancy"], "progress: got 'fancy'", "auto, bar, line, none"),
    Case("lr_infinite", ["optimizer.lr=inf"], "optimizer.lr: got inf", "a number > 0"),
    Case("lr_negative", ["optimizer.lr=-0.1"], "optimizer.lr: got -0.1", "a number > 0"),
    Case(
        "lr_zero_adam", ["optimizer=adam", "optimizer.lr=0"], "optimizer.lr: got 0", "a number > 0"
    ),
    Case("weight_decay_negative", ["optimizer.weight_decay=-1"], "optimizer.weight_decay", ">= 0"),
    Case("subset_zero", ["dataset.subset=0"], "dataset.subset: got 0", "an integer >= 1"),
    # values the reliability issue (13) named
    Case("signal_nan", ["dataset.signal=nan"], "dataset.signal: got nan", "a finite number"),
    Case("depth_huge", ["balance=recursive", "balance.depth=100"], "balance.depth: got 100", "GiB"),
    Case("batch_over_data", ["batch_size=128"], "batch_size: got 128", "an integer <= 64"),
    Case("name_escapes", ["name=../../x"], "name: got '../../x'", "hydra.run.dir=<path>"),
    Case(
        "bad_wandb_mode",
        ["logger.wandb.mode=sometimes"],
        "logger.wandb.mode: got 'sometimes'",
        "auto, disabled, offline, online",
    ),
    # trainer.cuda_graph: one process, no compile, one step shape (checked before the device)
    Case(
        "cuda_graph_distributed",
        ["trainer.cuda_graph=true", "distributed.simulate_workers=2", "balance=cd_grab"],
        "trainer.cuda_graph: got True",
        "false with distributed training",
    ),
    Case(
        "cuda_graph_compiled",
        ["trainer.cuda_graph=true", "trainer.compile=true"],
        "trainer.cuda_graph: got True",
        "false with trainer.compile=true",
    ),
    Case(
        "cuda_graph_odd_pairs",
        ["trainer.cuda_graph=true", "balance=pair", "batch_size=15"],
        "batch_size: got 15",
        "an even number",
    ),
]
if not torch.cuda.is_available():
    CASES.append(Case("cuda_absent", ["device=cuda"], "device: got 'cuda'", "auto, cpu"))
    CASES.append(
        Case(
            "cuda_graph_off_cuda",
            ["trainer.cuda_graph=true"],
            "trainer.cuda_graph: got True",
            "false with device=auto (a CUDA graph needs CUDA",
        )
    )
BY_ID = {case.id: case for case in CASES}


def assert_one_line(message: str, case: Case) -> None:
    assert "\n" not in message.strip(), f"not one line: {message!r}"
    assert case.key in message, f"{case.key!r} not named in {message!r}"
    assert case.allowed in message, f"{case.allowed!r} not in {message!r}"


@pytest.fixture
def booby_trapped(monkeypatch):
    """``run_job`` may validate, but must not load data or build the job."""

    def loaded(*args, **kwargs):
        raise AssertionError("data loaded (or the job built) before the config was validated")

    monkeypatch.setattr(run_module, "load_dataset", loaded)
    monkeypatch.setattr(run_module, "build_job", loaded)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_bad_input_fails_validation_before_data_loads(case, booby_trapped):
    cfg = compose_config(case.args)
    with pytest.raises(ConfigError) as info:
        run_module.run_job(cfg)
    assert_one_line(str(info.value), case)
    assert user_error_line(info.value) == str(info.value)


@pytest.mark.parametrize(
    "balance", sorted(n for n, c in Ordering.choices().items() if c.needs_grads)
)
def test_every_gradient_ordering_is_refused_with_the_classic_pipeline(balance):
    cfg = compose_config([*TINY, f"balance={balance}", "pipeline=classic"])
    with pytest.raises(ConfigError) as info:
        validate_config(cfg)
    assert f"balance {balance} needs per-sample gradients" in str(info.value)
    assert f"a balance of: {GRAD_FREE}" in str(info.value)


@pytest.mark.parametrize(
    "balance", sorted(n for n, c in Ordering.choices().items() if not c.needs_grads)
)
def test_gradient_free_orderings_are_accepted_with_the_classic_pipeline(balance):
    validate_config(compose_config([*TINY, f"balance={balance}", "pipeline=classic"]))


# wrong types: one line from the typed schema before Hydra composes (its own refusal is 5 lines)
TYPE_ERRORS = [
    (["epochs=two"], "epochs: got 'two'; allowed: an integer >= 1"),
    (["overwrite=maybe"], "overwrite: got 'maybe'; allowed: true or false"),
    (["distributed.workers=eight"], "distributed.workers: got 'eight'; allowed: an integer >= 1"),
    (["-m", "epochs=1,abc"], "epochs: got 'abc'; allowed: an integer >= 1"),
]


@pytest.mark.parametrize(("overrides", "line"), TYPE_ERRORS, ids=lambda v: str(v))
def test_wrong_types_are_one_line_from_the_schema(overrides, line):
    assert wrong_type_error([*TINY, *overrides]) == line


@pytest.mark.parametrize("args", [["logger=jsonl"], ["logger=wandb", "model=tiny"], ["epochs=3"]])
def test_a_group_option_or_a_right_value_is_no_wrong_type(args):
    assert wrong_type_error([*TINY, *args]) is None


def test_an_unknown_key_is_still_refused_by_hydra_when_composing():
    with pytest.raises(ConfigCompositionException) as info:
        compose_config([*TINY, "trainer.compiled=true"])
    assert "Could not override 'trainer.compiled'" in str(info.value)


def test_cli_refuses_a_wrong_type_before_anything_runs(tmp_path):
    result = _run([*TINY, "epochs=two", "progress=none"], tmp_path / "run")
    assert result.returncode == 1
    assert result.stderr.strip() == "error: epochs: got 'two'; allowed: an integer >= 1"
    assert run_artifacts(tmp_path) == [] and not (tmp_path / "run" / "outputs").exists()


UNKNOWN_KEYS = [
    (["balance.kernal=probabilistic"], "balance.kernal: no such key; did you mean balance.kernel?"),
    (
        ["balance=recursive", "balance.dept=3"],
        "balance.dept: no such key; did you mean balance.depth?",
    ),
    (["epoch=3"], "epoch: no such key; did you mean epochs?"),
    (
        ["-m", "seed=0,1", "trainer.compiled=true"],
        "trainer.compiled: no such key; did you mean trainer.compile?",
    ),
    (["model.zzzz=1"], "model.zzzz: no such key; allowed: model.num_classes"),
]


@pytest.mark.parametrize(("args", "line"), UNKNOWN_KEYS, ids=lambda v: str(v))
def test_an_unknown_key_names_the_closest_key(args, line):
    assert unknown_key_error([*TINY, *args]) == line


@pytest.mark.parametrize(
    "args",
    [
        ["epochs=2", "optimizer.lr=0.1", "hydra.run.dir=somewhere"],
        [
            "experiment=table1",
            "dataset=cifar10_jpeg",
            "dataset.archive=x.tar.gz",
        ],  # the preset's dataset option
        ["-m", "experiment=vrgd_large_batch", "arm=vr_adam", "optimizer.beta3=0.9"],
        ["row=recursive", "balance.depth=4", "pipeline.method=hooks"],
    ],
    ids=" ".join,
)
def test_a_command_of_known_keys_composes_nothing_of_its_own(args, monkeypatch):
    """Each group's option is read from conf/ (root defaults, presets, the command's choices), so
    the key check composes only to name an unknown key; Hydra composes the job."""
    from grab_exp.runner.launch import override_keys

    def compose(*args, **kwargs):
        raise AssertionError("the key check composed a config")

    monkeypatch.setattr(override_keys, "compose_config", compose)
    assert unknown_key_error(args) is None


def test_a_key_of_another_option_names_the_closest_key_of_this_one():
    """``dataset.archive`` is a key of ``dataset=cifar10_jpeg``, not of the default ``cifar10``:
    our line, not Hydra's advice to add it with ``+``."""
    line = "dataset.archive: no such key; did you mean dataset.data_dir?"
    assert unknown_key_error(["dataset.archive=x.tar.gz"]) == line


def test_known_keys_and_group_choices_pass_the_key_check():
    assert (
        unknown_key_error([*TINY, "balance=recursive", "balance.depth=3", "-m", "seed=0,1"]) is None
    )
    assert unknown_key_error(["--cfg", "job", "experiment=smoke"]) is None  # no key set: no compose


def test_cli_unknown_key_is_our_one_line_not_hydras_plus_advice(tmp_path):
    result = _run([*TINY, "balance.kernal=probabilistic"], tmp_path / "run")
    assert result.returncode == 1
    assert (
        result.stderr.strip() == "error: balance.kernal: no such key; did you mean balance.kernel?"
    )
    assert "+balance.kernal" not in result.stdout + result.stderr
    assert not (tmp_path / "run" / "outputs").exists()


def test_a_good_config_passes_validation():
    validate_config(compose_config([*TINY, "balance=recursive_pair", "batch_size=8"]))


# ---------------------------------------------------------------- what the user sees


def _run(args: list[str], cwd: Path, **env: str):
    cwd.mkdir(parents=True)
    return run_cli(args, cwd, timeout=CLI_TIMEOUT_S, OMP_NUM_THREADS="1", **env)


# the rules the issue names also run as real commands (each costs an `import torch`); the
# other cases share their code path from ConfigError to the printed line
CLI_CASE_IDS = {
    "recursive_pair_batch_12",
    "mean_with_classic",
    "missing_archive",
    "unknown_kernel",
    "c_zero",
    "depth_negative",
    "bad_dtype",
    "epochs_zero",
    "batch_size_zero",
    "bad_device",
    "bad_progress",
    "lr_negative",
    "bad_wandb_mode",
    "lr_infinite",
    "signal_nan",
    "depth_huge",
    "batch_over_data",
    "name_escapes",
    "cuda_graph_off_cuda",
}
CLI_RUNS = [(c.id, c.args, {}) for c in CASES if c.id in CLI_CASE_IDS] + [
    (f"{case_id}-full_error", BY_ID[case_id].args, {"HYDRA_FULL_ERROR": "1"})
    for case_id in ("recursive_pair_batch_12", "missing_archive")
]


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    """Every bad-input command, run concurrently (each mostly waits on ``import torch``)."""
    root = tmp_path_factory.mktemp("bad_inputs")
    workers = max(2, min(8, os.cpu_count() or 2))
    with ThreadPoolExecutor(workers) as pool:
        futures = {
            run_id: pool.submit(_run, args, root / run_id, **env) for run_id, args, env in CLI_RUNS
        }
        return {run_id: (future.result(), root / run_id) for run_id, future in futures.items()}


def assert_cli_one_line(result, cwd: Path, case: Case, validated: bool = True) -> None:
    """One ``error:`` line; with ``validated`` (a config rejected by validation), nothing on
    disk at all: no run directory, no ``.hydra/``, nothing outside ``cwd`` either."""
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 1, result.stdout + result.stderr
    assert len(lines) == 1, f"stderr is not one line:\n{result.stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in result.stdout + result.stderr
    assert_one_line(lines[0], case)
    assert run_artifacts(cwd) == [], "a run file was written before the config was validated"
    if validated:
        assert not (cwd / "outputs").exists() and not (cwd.parent / "x").exists()


@pytest.mark.parametrize("run_id", [r[0] for r in CLI_RUNS])
def test_cli_prints_one_error_line_and_writes_no_run(run_id, cli_results):
    case = BY_ID[run_id.split("-")[0]]
    result, cwd = cli_results[run_id]
    assert_cli_one_line(result, cwd, case)


# ---------------------------------------------------------------- loader errors (Hydra-wrapped)


def test_plain_command_offline_stops_fast_in_one_line_and_writes_nothing(tmp_path):
    """``python -m grab_exp`` with no CIFAR-10 on disk and no network (every connection goes
    to a closed port): one line naming both ways forward, in under 10 s, nothing on disk."""
    clone, cache = tmp_path / "clone", tmp_path / "cache"
    clone.mkdir()
    started = time.perf_counter()
    result = run_cli([], clone, timeout=CLI_TIMEOUT_S, XDG_CACHE_HOME=str(cache), **OFFLINE_ENV)
    seconds = time.perf_counter() - started
    case = Case(
        "cifar10_offline",
        [],
        f"dataset=cifar10: CIFAR-10 is not in {cache / 'grab_exp' / 'cifar10'}",
        "use dataset=cifar10_jpeg dataset.archive=PATH for an offline archive",
    )
    assert_cli_one_line(result, clone, case)
    assert "or experiment=smoke for a synthetic run" in result.stderr
    assert seconds < 10, f"took {seconds:.1f} s"
    assert list(clone.iterdir()) == [] and not cache.exists(), "the command wrote files"


def test_table1_multirun_offline_from_a_clone_is_one_line_and_writes_nothing(tmp_path):
    """``python -m grab_exp -m experiment=table1`` with no CIFAR-10 and no network: all 21 jobs
    have the one problem, said once with the ways forward; nothing on disk."""
    clone, cache = tmp_path / "clone", tmp_path / "cache"
    clone.mkdir()
    args = ["-m", "experiment=table1"]
    result = run_cli(args, clone, timeout=CLI_TIMEOUT_S, XDG_CACHE_HOME=str(cache), **OFFLINE_ENV)
    assert result.returncode == 1, result.stderr
    (line,) = result.stderr.strip().splitlines()
    head = "error: 21 of 21 jobs of this sweep cannot run, all for one reason; none started: "
    assert line.startswith(head + "dataset=cifar10: CIFAR-10 is not in"), line
    assert "dataset=cifar10_jpeg dataset.archive=PATH" in line and "experiment=smoke" in line
    assert list(clone.iterdir()) == [] and not cache.exists(), "the command wrote files"


def test_cifar10_download_failure_in_the_loader_is_the_same_one_line(tmp_path, monkeypatch):
    """Past the startup check (the server answered), a failed download says the same."""
    for name, value in OFFLINE_ENV.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError) as error:
        load_cifar10(data_dir=tmp_path / "cifar10", download_timeout_s=5)
    assert str(error.value).startswith(f"dataset=cifar10: CIFAR-10 is not in {tmp_path}")
    assert "dataset=cifar10_jpeg dataset.archive=PATH" in str(error.value)
    assert "\n" not in str(error.value)


def test_cli_loader_range_error_is_one_line(tmp_path):
    """A subset larger than the data is only known to the loader: still one line."""
    args = [*TINY, "dataset.subset=100", "progress=none"]
    result = run_cli(args, tmp_path, timeout=CLI_TIMEOUT_S, HYDRA_FULL_ERROR="1")
    case = Case("subset_too_large", args, "dataset.subset: got 100", "an integer in 1..64")
    assert_cli_one_line(result, tmp_path, case, validated=False)


def test_only_errors_raised_by_grab_exp_or_a_users_target_become_one_line():
    """A library's or a bug's error inside one of our targets keeps its traceback (no
    one-line); what a user's own target raised is one line naming it and the error."""

    def library_failure():
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    for target in ("grab_exp.data.load_cifar10", "my_data.load"):
        with pytest.raises(InstantiationException) as wrapped:
            try:
                library_failure()
            except RuntimeError as error:
                message = f"Error in call to target '{target}':\n..."
                raise InstantiationException(message) from error
        line = user_error_line(wrapped.value)
        if target.startswith("grab_exp."):
            assert line is None
        else:
            assert line.startswith("_target_: my_data.load raised RuntimeError: CUDA error: an")
    assert user_error_line(ValueError("epochs: got 0")) is None
    assert user_error_line(ConfigError("epochs: got 0; allowed: an integer >= 1")) == (
        "epochs: got 0; allowed: an integer >= 1"
    )


# ---------------------------------------------------------------- a whole sweep, before any job


def test_a_fail_fast_sweep_with_bad_jobs_lists_them_all_and_trains_nothing(tmp_path):
    """Job 0 is good, jobs 1 and 2 are not; with ``fail_fast`` as without it
    (runner/launch/test_sweeps_and_failures.py): all errors at once, exit 1, nothing written."""
    args = ["-m", *TINY, "seed=13", "batch_size=16,0,1000", "progress=none"]
    args.append("hydra.sweeper.fail_fast=true")
    result = run_cli(args, tmp_path, timeout=CLI_TIMEOUT_S)
    assert result.returncode == 1, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert lines[0] == "error: 2 of 3 jobs of this sweep cannot run; none started", lines
    assert re.fullmatch(r"  job 1 \(.*batch_size=0 .*\): batch_size: got 0; allowed: .*", lines[1])
    assert re.fullmatch(
        r"  job 2 \(.*batch_size=1000 .*\): batch_size: got 1000; .*<= 64.*", lines[2]
    )
    assert len(lines) == 3 and "Traceback" not in result.stderr
    assert "Launching" not in result.stdout  # no job started
    assert not (tmp_path / "outputs").exists()
