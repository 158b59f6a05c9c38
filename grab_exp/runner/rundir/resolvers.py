"""OmegaConf resolvers that derive run directories from the config (never the clock)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Iterable

from omegaconf import OmegaConf

# Override keys that are already part of the run directory's path, or that do not change
# what is computed (where logs go, whether to start over, how progress is shown).
PATH_KEYS = {"seed", "balance", "pipeline", "experiment", "row", "name", "logger"}
NEUTRAL_KEYS = {"overwrite", "progress", "trainer.cuda_graph"}
NEUTRAL_PREFIXES = ("logger.", "hydra.", "hydra/")


def variant_dir(balance: str, pipeline: str) -> str:
    """``<variant>`` for the functional pipeline, ``<variant>-<pipeline>`` otherwise: a run
    directory's first part, and the one key of a (variant, pipeline) row everywhere (Table 1's
    report, the epoch benchmark, ``scripts/results_numbers.py``)."""
    return balance if pipeline == "functional" else f"{balance}-{pipeline}"


def _override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def settings_hash(overrides: Iterable[str], extra_path_keys: Iterable[str] = ()) -> str:
    """``-<8 hex>`` of the overrides that change the run beyond its path, or ``""``.

    ``experiment`` is part of the path through its ``name``; a ``name=`` override breaks that
    link (``experiment=table1 name=smoke`` is not the smoke experiment), so then both are hashed.
    ``extra_path_keys`` are keys a preset's directory pattern spells out (e.g. ``batch_size``).
    """
    overrides = list(overrides)
    path_keys = PATH_KEYS | set(extra_path_keys)
    if any(_override_key(o) == "name" for o in overrides):
        # the directory's first level no longer names the experiment: hash which one it is
        path_keys = path_keys - {"name", "experiment"}
    kept = sorted(
        o
        for o in overrides
        if (key := _override_key(o)) not in path_keys | NEUTRAL_KEYS
        and not key.startswith(NEUTRAL_PREFIXES)
    )
    if not kept:
        return ""
    return "-" + hashlib.sha1("\n".join(kept).encode()).hexdigest()[:8]


def sqrt_batch_lr(base_lr: float, base_batch_size: int, batch_size: int) -> float:
    """The square-root scaling rule: ``base_lr * sqrt(batch_size / base_batch_size)``."""
    if base_lr <= 0 or base_batch_size < 1 or batch_size < 1:
        raise ValueError(
            f"grab.sqrt_batch_lr: needs base_lr > 0 and batch sizes >= 1; got "
            f"base_lr={base_lr}, base_batch_size={base_batch_size}, batch_size={batch_size}"
        )
    return float(base_lr) * math.sqrt(batch_size / base_batch_size)


def config_subdir(overwrite: bool) -> str | None:
    """``hydra.output_subdir``: ``.hydra``, or ``None`` for a job that will be skipped.

    Hydra writes ``.hydra/{config,hydra,overrides}.yaml`` before the job starts; a finished run
    that is skipped keeps the files it ran with, so they go on describing that run.
    """
    from hydra.core.hydra_config import HydraConfig

    from grab_exp.runner.rundir.state import will_skip

    try:
        run_dir = HydraConfig.get().runtime.output_dir
    except ValueError:  # no job yet (e.g. --cfg hydra --resolve)
        return ".hydra"
    return None if run_dir and will_skip(run_dir, overwrite) else ".hydra"


def register_resolvers() -> None:
    """Register the ``grab.*`` resolvers (idempotent)."""
    OmegaConf.register_new_resolver("grab.variant_dir", variant_dir, replace=True)
    OmegaConf.register_new_resolver(
        "grab.settings_hash",
        lambda overrides, extra=(): settings_hash(list(overrides), list(extra)),
        replace=True,
    )
    OmegaConf.register_new_resolver("grab.sqrt_batch_lr", sqrt_batch_lr, replace=True)
    OmegaConf.register_new_resolver("grab.config_subdir", config_subdir, replace=True)
