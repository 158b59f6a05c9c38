"""The framework as users install it: a built wheel, in a fresh venv, outside the source tree.

The wheel is built from a copy of the package's files (nothing is written into the checkout) and
installed with ``--no-deps`` into a new venv that sees this environment's packages (torch,
Hydra...) after its own, through a ``.pth`` line, so the ``grab_exp`` it imports is the wheel's.
From a folder outside the tree, ``python -m grab_exp experiment=smoke`` trains, and so does a
user's own model, added as one Python file and one YAML file in a config folder of theirs
(``--config-dir``).
"""

from __future__ import annotations

import json
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from support.grab_run import CONF_DIR, REPO_ROOT, cli_env

PACKAGE_FILES = (
    "pyproject.toml",
    "setup.py",
    "LICENSE",
    "README.md",
    "grab_exp",
    "conf",
    "hydra_plugins",
)
USER_MODEL = '''
"""A user's own model."""

from torch import nn


class Tiny(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.head = nn.Linear(3 * 32 * 32, num_classes)

    def forward(self, x):
        return self.head(x.flatten(1))
'''
USER_YAML = """\
# A user's model: one linear layer on flattened 32x32 RGB images.
_target_: tiny_model.Tiny  # the user's class (tiny_model.py beside the command)
num_classes: 10  # output logits
"""


def _run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        args, cwd=cwd, env=cli_env(**env), capture_output=True, text=True, timeout=600
    )


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The python of a fresh venv holding the wheel built from this checkout."""
    root = tmp_path_factory.mktemp("wheel")
    source = root / "source"
    source.mkdir()
    for name in PACKAGE_FILES:
        path = REPO_ROOT / name
        if path.is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.egg-info")
            shutil.copytree(path, source / name, ignore=ignore)
        else:
            shutil.copy2(path, source / name)
    build = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
    done = _run([*build, "-w", str(root / "dist"), str(source)], root)
    assert done.returncode == 0, done.stderr
    (wheel,) = (root / "dist").glob("grab_exp-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    venv_site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    (Path(venv_site) / "outer.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    install = [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q"]
    done = _run([*install, str(wheel)], root)
    assert done.returncode == 0, done.stderr
    return python


@pytest.mark.slow
def test_the_installed_wheel_holds_the_configs_and_imports_from_the_venv(installed, tmp_path):
    code = "import grab_exp, grab_exp.conf as c; print(grab_exp.__file__); print(c.CONF_DIR)"
    done = _run([str(installed), "-c", code], tmp_path)
    assert done.returncode == 0, done.stderr
    module, conf = (Path(line) for line in done.stdout.split())
    venv = installed.parents[1]
    assert venv in module.parents and venv in conf.parents, done.stdout
    found = {p.relative_to(conf).as_posix() for p in conf.rglob("*.yaml")}
    assert found == {p.relative_to(CONF_DIR).as_posix() for p in CONF_DIR.rglob("*.yaml")}


@pytest.mark.slow
def test_the_installed_wheel_trains_the_smoke_experiment_outside_the_tree(installed, tmp_path):
    run_dir = tmp_path / "run"
    args = [str(installed), "-m", "grab_exp", "experiment=smoke", "progress=none"]
    done = _run([*args, f"hydra.run.dir={run_dir}"], tmp_path, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr
    assert json.loads((run_dir / "summary.json").read_text())["status"] == "finished"


@pytest.mark.slow
def test_a_user_model_from_a_config_folder_of_theirs_trains_with_the_installed_wheel(
    installed, tmp_path
):
    (tmp_path / "tiny_model.py").write_text(USER_MODEL)
    (tmp_path / "my_conf" / "model").mkdir(parents=True)
    (tmp_path / "my_conf" / "model" / "tiny.yaml").write_text(USER_YAML)
    run_dir = tmp_path / "run"
    args = [str(installed), "-m", "grab_exp", "--config-dir", "my_conf", "experiment=smoke"]
    args += ["model=tiny", "progress=none", f"hydra.run.dir={run_dir}"]
    done = _run(args, tmp_path, OMP_NUM_THREADS="1")
    assert done.returncode == 0, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "finished"
    log = (run_dir / "__main__.log").read_text()
    assert "model Tiny (30,730 parameters)" in log, log


def test_no_module_reaches_the_configs_by_a_relative_file_path():
    """The configs are read through the package (grab_exp.conf), never from ``parents[k]``."""
    offenders = []
    for path in (REPO_ROOT / "grab_exp").rglob("*.py"):
        if path.name == "source_tree.py":  # mounts conf/ as grab_exp.conf in an uninstalled tree
            continue
        text = path.read_text()
        if '"../conf"' in text or '/ "conf"' in text:
            offenders.append(path.relative_to(REPO_ROOT).as_posix())
    assert not offenders, offenders


@pytest.mark.slow
def test_the_wheel_holds_every_config_of_the_checkout(installed):
    (wheel,) = installed.parents[2].joinpath("dist").glob("grab_exp-*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.endswith(".yaml")}
    ours = {f"grab_exp/{p.relative_to(REPO_ROOT).as_posix()}" for p in CONF_DIR.rglob("*.yaml")}
    assert shipped == ours  # conf/ at the top of the tree, grab_exp/conf/ in the wheel
    assert not any(
        n.startswith("conf/") or "__pycache__" in n for n in zipfile.ZipFile(wheel).namelist()
    )


@pytest.mark.slow
def test_a_source_tree_on_pythonpath_reads_its_own_configs(installed, tmp_path):
    """Without an install (``scripts/gpu_check.sh``), the tree's conf/ is ``grab_exp.conf``,
    even where another checkout is installed editable (this environment's)."""
    source = installed.parents[2] / "source"
    code = "import grab_exp.conf as c; print(c.CONF_DIR)"
    done = _run([sys.executable, "-c", code], tmp_path, PYTHONPATH=str(source))
    assert done.returncode == 0, done.stderr
    assert Path(done.stdout.strip()) == source / "conf"
