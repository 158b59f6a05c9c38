"""OmegaConf resolvers that derive run directories from the config (never the clock)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

from omegaconf import OmegaConf

# Override keys that are already part of the run directory's path, or that do not change
# what is computed (where logs go, whether to start over, how progress is shown).
PATH_KEYS = {"seed", "balance", "pipeline", "experiment", "row", "name", "logger"}
NEUTRAL_KEYS = {"overwrite", "progress"}
NEUTRAL_PREFIXES = ("logger.", "hydra.", "hydra/")


def variant_dir(balance: str, pipeline: str) -> str:
    """``<variant>`` for the functional pipeline, ``<variant>-<pipeline>`` otherwise."""
    return balance if pipeline == "functional" else f"{balance}-{pipeline}"


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def settings_hash(overrides: Iterable[str]) -> str:
    """``-<8 hex>`` of the overrides that change the run beyond its path, or ``""``.

    ``experiment`` is part of the path through its ``name``; a ``name=`` override breaks that
    link (``experiment=table1 name=smoke`` is not the smoke experiment), so then both are hashed.
    """
    overrides = list(overrides)
    path_keys = PATH_KEYS
    if any(_override_key(o) == "name" for o in overrides):
        # the directory's first level no longer names the experiment: hash which one it is
        path_keys = PATH_KEYS - {"name", "experiment"}
    kept = sorted(
        o
        for o in overrides
        if (key := _override_key(o)) not in path_keys | NEUTRAL_KEYS
        and not key.startswith(NEUTRAL_PREFIXES)
    )
    if not kept:
        return ""
    return "-" + hashlib.sha1("\n".join(kept).encode()).hexdigest()[:8]


def register_resolvers() -> None:
    """Register ``grab.variant_dir`` and ``grab.settings_hash`` (idempotent)."""
    OmegaConf.register_new_resolver("grab.variant_dir", variant_dir, replace=True)
    OmegaConf.register_new_resolver(
        "grab.settings_hash", lambda overrides: settings_hash(list(overrides)), replace=True
    )
