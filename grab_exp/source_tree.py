"""``grab_exp.conf`` when the package is imported from a source tree that was not installed.

The configs live at the top of the source tree (``conf/``, beside ``grab_exp/``); a wheel and an
editable install map them to the package ``grab_exp.conf`` (``setup.py``). A tree put on
``PYTHONPATH`` instead (``scripts/gpu_check.sh``, a benchmark of another commit's worktree) has no
such mapping, so its own ``conf/`` is registered here under that name: the configs read are
always those beside the code that runs.
"""

import importlib.util
import sys
from pathlib import Path

#: the source tree holding this package, if it is one (``pyproject.toml`` beside ``grab_exp/``)
TREE = Path(__file__).resolve().parents[1]


def mount_conf() -> None:
    """Register the tree's ``conf/`` as ``grab_exp.conf`` (nothing in an installed wheel)."""
    init = TREE / "conf" / "__init__.py"
    if "grab_exp.conf" in sys.modules or not (TREE / "pyproject.toml").is_file():
        return
    if not init.is_file():
        return
    spec = importlib.util.spec_from_file_location(
        "grab_exp.conf", init, submodule_search_locations=[str(init.parent)]
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["grab_exp.conf"] = module
    spec.loader.exec_module(module)
