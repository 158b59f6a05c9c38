"""Where data files live: the repository root and the default cache directory."""

from __future__ import annotations

import os
from pathlib import Path

REPO_MARKER = "pyproject.toml"


def repo_root() -> Path:
    """Return the repository root: the nearest directory above this package with pyproject.toml.

    Falls back to the current working directory when the package is installed outside a
    checkout. It does not depend on the working directory otherwise, so paths resolve the
    same after Hydra changes into a run directory.
    """
    for directory in Path(__file__).resolve().parents:
        if (directory / REPO_MARKER).is_file():
            return directory
    return Path.cwd()


def resolve_from_repo(path: str | os.PathLike[str]) -> Path:
    """Expand ``~`` and make a relative path absolute against :func:`repo_root`."""
    expanded = Path(path).expanduser()
    return expanded if expanded.is_absolute() else (repo_root() / expanded).resolve()


def resolve_from_cwd(path: str | os.PathLike[str]) -> Path:
    """Expand ``~`` and make a relative path absolute against the folder the command ran in
    (a user's data; jobs keep that folder as their working directory: ``hydra.job.chdir=false``)."""
    expanded = Path(path).expanduser()
    return expanded if expanded.is_absolute() else (Path.cwd() / expanded).resolve()


def default_cache_dir() -> Path:
    """Return ``$XDG_CACHE_HOME/grab_exp`` (``~/.cache/grab_exp`` when the variable is unset)."""
    cache_home = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache_home) / "grab_exp"


def resolve_cache_dir(cache_dir: str | os.PathLike[str] | None) -> Path:
    """Return ``cache_dir`` resolved against the repository root, or the default when ``None``."""
    return default_cache_dir() if cache_dir is None else resolve_from_repo(cache_dir)
