"""Where a run came from: library versions, the machine and the git commit, stamped into
``summary.json``."""

from __future__ import annotations

import functools
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path

_DISTRIBUTIONS = {
    "torch": "torch",
    "torchvision": "torchvision",
    "hydra": "hydra-core",
    "wandb": "wandb",
}


@functools.lru_cache(maxsize=1)
def library_versions() -> dict[str, str | None]:
    """Versions of python, torch, torchvision, hydra and wandb (``None`` if not installed)."""
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for key, distribution in _DISTRIBUTIONS.items():
        try:
            versions[key] = metadata.version(distribution)
        except metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def cpu_model() -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else :func:`platform.processor`, else
    ``"unknown"``."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _memory_gib() -> float | None:
    """Physical memory in GiB (``None`` where ``sysconf`` does not tell)."""
    try:
        return round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30, 1)
    except (AttributeError, ValueError, OSError):
        return None


@functools.lru_cache(maxsize=1)
def machine() -> dict[str, str | int | float | None]:
    """The machine a run trained on: CPU model, logical cores, physical memory (GiB) and
    platform."""
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "memory_gib": _memory_gib(),
        "platform": platform.platform(),
    }


@functools.lru_cache(maxsize=1)
def git_commit() -> str | None:
    """``git rev-parse HEAD`` of the repository that contains this package, else ``None``.

    ``None`` when git is missing, the package is not in a git work tree, or the repository has
    no commit yet; this function never raises.
    """
    package_dir = Path(__file__).resolve().parents[1]
    try:
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=package_dir,
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None
