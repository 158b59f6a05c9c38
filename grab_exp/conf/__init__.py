"""The experiment framework's configs: one folder per config group, shipped as package data.

Hydra reads them as ``pkg://grab_exp.conf`` (``python -m grab_exp``); the readers of single files
(a run's identity, the override check, the report's rows) read :data:`CONF_DIR`. A user's own
groups and options compose with these from a folder of theirs: ``--config-dir DIR`` (see
``docs/your-experiment.md``).
"""

from importlib import resources
from pathlib import Path

#: the folder of the configs, where the package is installed
CONF_DIR = Path(str(resources.files(__name__)))
