"""Helpers for the config and CLI tests: compose ``conf/`` with Hydra, run ``python -m grab_exp``.

``compose_config`` uses Hydra's own compose API on the repository's ``conf/`` directory (the
same files ``python -m grab_exp`` reads); ``run_cli`` runs the real command in a subprocess
with stdout and stderr kept apart, so a test sees exactly what a user sees on the terminal.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.global_hydra import GlobalHydra
from omegaconf import DictConfig, OmegaConf

from grab_exp.runner.resolvers import register_resolvers

REPO_ROOT = Path(__file__).resolve().parents[1]
CONF_DIR = REPO_ROOT / "conf"
ARCHIVE = REPO_ROOT.parent / "shared" / "data" / "cifar10-jpeg.tar.gz"
needs_archive = pytest.mark.skipif(
    not ARCHIVE.is_file(), reason=f"CIFAR-10 JPEG archive absent: {ARCHIVE}"
)

# every outgoing HTTP(S) connection of a subprocess goes to a closed local port: the cifar10
# download fails at once, online or not (and never fetches 170 MB)
DEAD_PROXY = "http://127.0.0.1:9"
OFFLINE_ENV = {
    **{name: DEAD_PROXY for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy")},
    "NO_PROXY": "",
    "no_proxy": "",
}
# files a run writes once its data is loaded (Hydra's own .hydra/ files come earlier)
RUN_ARTIFACTS = ("metrics.csv", "summary.json", "checkpoint.pt")


def group_options() -> list[tuple[str, str]]:
    """``(group, option)`` for every ``conf/<group>/<option>.yaml`` (nested groups included)."""
    options = []
    for path in sorted(CONF_DIR.rglob("*.yaml")):
        group = path.parent.relative_to(CONF_DIR).as_posix()
        if group != ".":
            options.append((group, path.stem))
    return options


def root_default_groups() -> set[str]:
    """Groups named in ``conf/config.yaml``'s defaults list (overridden as ``group=option``)."""
    groups = set()
    for entry in OmegaConf.load(CONF_DIR / "config.yaml").defaults:
        if isinstance(entry, DictConfig):
            groups.update(str(key).removeprefix("override ").strip() for key in entry)
    return groups


def option_override(group: str, option: str) -> str:
    """``group=option`` for a group of the root defaults list, ``+group=option`` otherwise."""
    prefix = "" if group in root_default_groups() else "+"
    return f"{prefix}{group}={option}"


def compose_config(overrides: Iterable[str] = (), *, hydra: bool = False) -> DictConfig:
    """Compose ``conf/config.yaml`` with ``overrides``, as ``python -m grab_exp`` would.

    Args:
        overrides: Hydra command-line overrides.
        hydra: also return the ``hydra`` node (launcher, sweeper, runtime choices).
    """
    register_resolvers()
    GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=hydra)


def cli_env(**extra: str) -> dict[str, str]:
    """Environment of a ``python -m grab_exp`` subprocess: no W&B, Hydra's default errors."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("WANDB_") and k != "HYDRA_FULL_ERROR"
    }
    env.update(WANDB_MODE="disabled", WANDB_SILENT="true", **extra)
    return env


def run_cli(
    args: Iterable[str], cwd: Path, *, timeout: float = 120, **env: str
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m grab_exp *args`` in ``cwd``; stdout and stderr captured separately."""
    return subprocess.run(
        [sys.executable, "-m", "grab_exp", *args],
        cwd=cwd,
        env=cli_env(**env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_artifacts(cwd: Path) -> list[Path]:
    """Files under ``cwd`` that only a run that loaded its data writes."""
    return sorted(p for p in cwd.rglob("*") if p.name in RUN_ARTIFACTS)
