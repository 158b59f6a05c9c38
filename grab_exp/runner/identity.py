"""What a run is: the ``identity`` block of ``summary.json`` and of the W&B run's config.

``grab_exp.report.collect`` reads runs by this block alone, local or from W&B.
"""

from __future__ import annotations

from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from grab_exp.runner.resolvers import settings_hash

#: override keys that identity fields name besides the run directory's path keys
NAMED_KEYS = ("optimizer", "arm", "batch_size")


def run_identity(cfg: DictConfig, world_size: int) -> dict[str, Any]:
    """The identity of the job that ``cfg`` describes, run on ``world_size`` workers.

    ``overrides_hash`` is the hash of every override that no other identity field names
    (``""`` when there is none): two runs with equal identities computed the same thing.
    """
    hydra = HydraConfig.get()
    choices = hydra.runtime.choices
    return {
        "experiment": cfg.name,
        "variant": choices["balance"],
        "pipeline": choices["pipeline"],
        "optimizer": choices["optimizer"],
        "arm": choices.get("arm"),
        "row": choices.get("row"),
        "batch_size": cfg.batch_size,
        "world_size": world_size,
        "seed": cfg.seed,
        "overrides_hash": settings_hash(hydra.overrides.task, NAMED_KEYS).lstrip("-"),
    }
