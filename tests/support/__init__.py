"""The tests' support package: running and reading ``python -m grab_exp``, and shared helpers.

``tests/`` is on ``sys.path`` (pytest puts the rootdir ``conftest.py``'s folder there), so a test
imports ``from support.grab_run import ...``; ``distributed_worker.py``, run by path, puts it there
itself. ``data/`` holds the recorded runs and orders that tests compare today's code with.
"""

from pathlib import Path

TESTS_DIR = Path(__file__).resolve().parents[1]
REPO_ROOT = TESTS_DIR.parent
DATA_DIR = TESTS_DIR / "support" / "data"  # recorded runs and orders the tests compare with
