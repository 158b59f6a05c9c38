"""Errors a user causes, through ``python -m grab_exp`` as they type it: each one line naming the
setting or file, exit status 1, and nothing left on disk (a multirun: its ``multirun.yaml``).

Unwritable run and sweep folders, an option a group lacks, a ``_target_`` (a logger's too) that
cannot be imported, a user's model or loader that raises, a value of the wrong type, a missing
``--config-dir``, a ``.yaml`` of theirs that is not YAML, a model that does not fit the data, a
user's loss that raises in training; and a user's file of our name wins, saying so in the job's
line.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.grab_run import run_cli

SMALL = ["experiment=smoke", "dataset.num_train=64", "dataset.num_test=32", "progress=none"]
OWN_DATA = ["experiment=smoke", "progress=none"]  # a user's loader takes none of the sizes
USER_FILES = {
    "boom.py": (
        "from torch import nn\n\n\nclass Boom(nn.Module):\n"
        "    def __init__(self, num_classes=10):\n        super().__init__()\n"
        '        raise ValueError("width must be even")\n'
    ),
    "my_loader.py": "import numpy as np\n\n\ndef load(path):\n    return np.load(path)\n",
    "my_conf/model/boom.yaml": "_target_: boom.Boom\nnum_classes: 10\n",
    "my_conf/model/ghost.yaml": "_target_: nosuchmod.Net\nnum_classes: 10\n",
    "my_conf/dataset/mine.yaml": "_target_: my_loader.load\npath: data.npz\n",
    "my_conf/dataset/ghost.yaml": "_target_: nosuchmod.load\n",
    "focal.py": (
        "import torch\nfrom torch import nn\n\nfrom grab_exp.losses import Loss\n\n\n"
        "class Focal(Loss):\n    def __init__(self, gamma=2.0):\n        self.gamma = gamma\n\n"
        "    def total(self, logits, y):\n"
        '        ce = nn.functional.cross_entropy(logits, y, reduction="none")\n'
        "        weight = 1 - torch.exp(-ce)\n"
        "        return (weight**self.gamma * ce).sum()\n"
    ),
    "my_conf/loss/focal.yaml": "_target_: focal.Focal\ngamma: 2.0\n",
    "my_conf/loss/torch_ce.yaml": "_target_: torch.nn.CrossEntropyLoss\n",
}


@pytest.fixture
def project(tmp_path) -> Path:
    """A user's project folder: their modules and a config folder (``my_conf``)."""
    for name, text in USER_FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    return tmp_path


def _files(root: Path) -> set[str]:
    return {p.relative_to(root).as_posix() for p in root.rglob("*")}


def _refused(args: list[str], cwd: Path, start: str) -> str:
    """Run ``args``; check one ``error:`` line starting with ``start`` and nothing written."""
    before = _files(cwd)
    done = run_cli(args, cwd)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0].startswith(f"error: {start}"), lines[0]
    assert _files(cwd) == before, _files(cwd) - before
    return lines[0]


@pytest.mark.parametrize(
    ("args", "start", "names"),
    [
        (["hydra.run.dir=/proc/x"], "hydra.run.dir: cannot create the folder /proc/x (", []),
        (["-m", "hydra.sweep.dir=/proc/x"], "hydra.sweep.dir: cannot create the folder /proc", []),
        ([], "hydra.run.dir: cannot write the folder ", ["outputs is a file, not a folder"]),
        (["-m", "seed=0,1"], "hydra.sweep.dir: cannot write the folder ", ["outputs is a file"]),
    ],
    ids=["run-dir-in-proc", "sweep-dir-in-proc", "outputs-a-file", "sweep-outputs-a-file"],
)
def test_an_unwritable_run_or_sweep_folder_is_one_line_naming_it(tmp_path, args, start, names):
    (tmp_path / "outputs").write_text("a file where the runs would go")
    line = _refused([*args, *SMALL], tmp_path, start)
    assert all(name in line for name in names), line
    assert line.endswith("PATH)"), line  # the setting to change


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["balance=Mean"], "balance=Mean: no such option; did you mean balance=mean? allowed: "),
        (["-m", "balance=pair,grb"], "balance=grb: no such option; did you mean balance="),
        (["model=tny"], "model=tny: no such option; did you mean model=tiny? allowed: "),
    ],
)
def test_an_option_a_group_lacks_is_one_line_with_the_options(project, args, line):
    (project / "my_conf" / "model" / "tiny.yaml").write_text("_target_: boom.Boom\n")
    found = _refused(["--config-dir", "my_conf", *args, *SMALL], project, line)
    listed = "lenet, logreg, mlp, resnet18_gn, tiny, word_lm" if "model" in line else "mean, pair"
    assert listed in found  # the options, ours and the user's


@pytest.mark.parametrize(
    ("option", "line"),
    [
        (
            "model=ghost",
            "model._target_: cannot import nosuchmod.Net (ModuleNotFoundError: No module named "
            "'nosuchmod') in my_conf/model/ghost.yaml;",
        ),
        (
            "dataset=ghost",
            "dataset._target_: cannot import nosuchmod.load (ModuleNotFoundError: No module "
            "named 'nosuchmod') in my_conf/dataset/ghost.yaml;",
        ),
        ("model=boom", "model: boom.Boom raised ValueError: width must be even (boom.py:7)"),
    ],
)
def test_a_target_that_cannot_be_imported_or_raises_is_one_line_naming_its_file(
    project, option, line
):
    _refused(["--config-dir", "my_conf", option, *OWN_DATA], project, line)


def test_an_extra_logger_that_cannot_be_imported_is_the_same_one_line_as_a_model(project):
    line = (
        "logger.extra.mine._target_: cannot import nosuchmod.Log (ModuleNotFoundError: No module "
        "named 'nosuchmod'); allowed: a module.name on the import path"
    )
    _refused(["+logger.extra.mine._target_=nosuchmod.Log", *SMALL], project, line)


def test_a_value_of_the_wrong_type_is_one_line_with_what_the_key_takes(tmp_path):
    _refused(["epochs=abc", *SMALL], tmp_path, "epochs: got 'abc'; allowed: an integer >= 1")


@pytest.mark.parametrize("flag", ["--config-dir", "-cd"])
def test_a_config_dir_that_does_not_exist_is_one_line_naming_it(tmp_path, flag):
    line = _refused([flag, "nonexist", *SMALL], tmp_path, "--config-dir nonexist: no such folder (")
    assert str(tmp_path / "nonexist") in line, line


def test_a_yaml_file_of_the_user_that_is_not_yaml_is_one_line_with_its_line(project):
    (project / "my_conf" / "model" / "bad.yaml").write_text("_target_: boom.Boom\nwidth: [8\n")
    line = "my_conf/model/bad.yaml, line 3: not YAML (expected ',' or ']', but got '<stream end>'"
    _refused(["--config-dir", "my_conf", "model=bad", *SMALL], project, line)


def test_a_loader_that_raises_names_the_file_and_leaves_no_run_folder(project):
    line = (
        "dataset: my_loader.load raised FileNotFoundError: No such file or directory: data.npz "
        "(my_loader.py:5)"
    )
    _refused(["--config-dir", "my_conf", "dataset=mine", *OWN_DATA], project, line)


def test_a_loader_given_a_keyword_it_lacks_names_no_file_of_hydra(project):
    line = _refused(
        ["--config-dir", "my_conf", "dataset=mine", "+dataset.size=3", *OWN_DATA],
        project,
        "dataset: my_loader.load raised TypeError: ",
    )
    assert "unexpected keyword argument 'size'" in line, line
    assert "hydra" not in line and line.endswith("'size'"), line  # no file of Hydra's


@pytest.mark.parametrize("method", ["auto", "hooks", "func"])
def test_a_loss_of_the_user_that_raises_in_training_is_one_line_naming_it(project, method):
    args = ["--config-dir", "my_conf", "loss=focal", "loss.gamma=abc", *SMALL]
    done = run_cli([*args, f"pipeline.method={method}"], project)
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    assert lines[0] == (
        "error: loss: focal.Focal raised TypeError: unsupported operand type(s) for ** or pow(): "
        "'Tensor' and 'str' (focal.py:14)"
    ), lines[0]


def test_a_loss_that_is_not_ours_is_one_line_before_anything_is_written(project):
    line = (
        "loss: torch.nn.CrossEntropyLoss made a CrossEntropyLoss; allowed: a grab_exp.losses.Loss"
    )
    _refused(["--config-dir", "my_conf", "loss=torch_ce", *SMALL], project, line)


def test_multirun_flag_after_the_overrides_runs_the_sweep(tmp_path):
    done = run_cli([*SMALL, "epochs=1", "-m", "seed=0,1"], tmp_path)  # Hydra takes -m first only
    assert done.returncode == 0, done.stderr
    runs = sorted(p.parent.name.split("-")[0] for p in tmp_path.rglob("metrics.csv"))
    assert runs == ["seed0", "seed1"], runs


def test_a_refused_sweep_keeps_only_its_multirun_yaml(project):
    args = ["-m", "--config-dir", "my_conf", "dataset=mine", "seed=0,1", *OWN_DATA]
    done = run_cli(args, project)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 2, done.stderr
    assert all("FileNotFoundError: No such file or directory: data.npz" in e for e in errors)
    assert sorted(p.as_posix() for p in (project / "outputs").rglob("*")) == [
        (project / "outputs" / "smoke").as_posix(),
        (project / "outputs" / "smoke" / "multirun.yaml").as_posix(),
    ]


def test_a_model_that_does_not_fit_the_data_leaves_no_run_folder(tmp_path):
    line = "model.num_classes: LeNet outputs (3,) per example but dataset=synthetic has 10 classes"
    _refused(["model.num_classes=3", *SMALL], tmp_path, line)


def test_the_users_file_of_our_name_wins_and_the_job_line_says_so(project):
    lenet = project / "my_conf" / "model" / "lenet.yaml"
    lenet.write_text("_target_: grab_exp.models.MLP\nin_features: null\nhidden: [4]\n")
    args = ["--config-dir", "my_conf", *SMALL, "epochs=1", "model.hidden=[8]"]  # a key of theirs
    done = run_cli(args, project)
    assert done.returncode == 0, done.stderr
    (job,) = [line for line in done.stdout.splitlines() if " - job: " in line]
    assert "model MLP (24,674 parameters)" in job, job  # 3072 -> 8 -> 10
    assert ", 1 epoch of batch " in job, job  # singular for one
    assert job.endswith(f"; {lenet} replaces ours"), job
