"""The experiment framework's configs: one folder per config group, shipped as package data.

This folder is ``conf/`` at the top of the source tree; ``setup.py`` installs it as the package
``grab_exp.conf`` (a wheel, or ``pip install -e .``), and ``grab_exp.source_tree`` mounts it under
that name when a tree runs from ``PYTHONPATH``.

Hydra reads them as ``pkg://grab_exp.conf`` (``python -m grab_exp``); the readers of single files
(a run's identity, the override check, the report's rows) read :data:`CONF_DIR`. A user's own
groups and options compose with these from a folder of theirs: ``--config-dir DIR`` (see
``docs/your-experiment.md``).
"""

from importlib import resources
from pathlib import Path

#: the folder of the configs, where the package is installed
CONF_DIR = Path(str(resources.files(__name__)))
