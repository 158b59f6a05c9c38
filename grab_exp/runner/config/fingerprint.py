"""One run directory, one config: the composed config's fingerprint, and the drift check.

A run directory is named by the command's overrides (``hydra.run.dir``), not by the composed
config: a default or preset edited between two runs of the same command lands in the same
directory. Every job records its composed config (resolved, as flat dotted keys, less the keys
that do not change what it computes) in ``summary.json`` and in each checkpoint, and a job that
finds a run of another config in its directory refuses to skip or resume it, in one line.
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from grab_exp.runner.config.schema import ConfigError

log = logging.getLogger("grab_exp")
#: keys that do not change what a run computes: where it logs, how it shows progress, whether
#: it starts over, how long a collective may wait, ``epochs`` (how far it goes: no schedule
#: reads it, so a run extended by more epochs continues exactly), and the device request
#: (``auto`` and ``cuda`` may name one device; the checkpoint records the device type its
#: generators ran on, and a resume on another type is refused by that record), and whether the
#: step is replayed from a CUDA graph (the same numbers as eager, a capturable Adam's rounding
#: aside: either resumes the other), and how often the per-sample check runs (it refuses or
#: leaves no trace)
UNCHECKED = ("hydra", "logger", "progress", "overwrite", "device", "distributed.timeout_s")
UNCHECKED += ("epochs", "trainer.cuda_graph", "pipeline.check_every")


class ConfigDriftError(ConfigError):
    """The run directory holds a run of another composed config."""


def _flatten(node: Any, prefix: str, out: dict[str, Any]) -> dict[str, Any]:
    if isinstance(node, dict) and node:
        for key, value in node.items():
            _flatten(value, f"{prefix}.{key}" if prefix else str(key), out)
    else:
        out[prefix] = node
    return out


def _unchecked(key: str) -> bool:
    return any(key == name or key.startswith(name + ".") for name in UNCHECKED)


def config_fingerprint(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as ``{"sha256": <hex>, "config": {dotted key: value}}``.

    ``config`` is the resolved config, flat, less :data:`UNCHECKED` (``hydra`` included).
    """
    container = {
        key: OmegaConf.to_container(value, resolve=True) if OmegaConf.is_config(value) else value
        for key, value in cfg.items()
        if key != "hydra"
    }
    flat = {k: v for k, v in _flatten(container, "", {}).items() if not _unchecked(k)}
    text = json.dumps(flat, sort_keys=True, default=str)
    return {"sha256": hashlib.sha256(text.encode()).hexdigest(), "config": flat}


def _differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """``key old -> new`` of every key both configs have with different values (a key only one
    has was added to or removed from the code in between, not set by the user)."""
    keys = sorted(k for k in old.keys() & new.keys() if not _unchecked(k) and old[k] != new[k])
    return [f"{key} {old[key]!r} -> {new[key]!r}" for key in keys]


def check_same_config(
    run_dir: Path, recorded: dict[str, Any] | None, current: dict[str, Any], source: str
) -> None:
    """Refuse to continue a run whose recorded config differs from ``current``.

    Args:
        run_dir: The run directory (for the message).
        recorded: The flat config that ``source`` recorded, ``None`` when it predates
            fingerprints (then nothing can be checked: the log says so).
        current: ``config_fingerprint(cfg)["config"]`` of this job.
        source: The file that recorded it (``summary.json`` or ``checkpoint.pt``).

    Raises:
        ConfigDriftError: one line naming every key that differs, its old and new value, and
            the two ways forward.
    """
    if recorded is None:
        log.info(
            "%s: %s was written before configs were fingerprinted; the config it ran with is "
            "unknown and not checked",
            run_dir,
            source,
        )
        return
    differences = _differences(recorded, current)
    if differences:
        raise ConfigDriftError(
            f"{run_dir} holds a run of another config ({source}: {'; '.join(differences)}); "
            "overwrite=true starts it over (the old run is kept aside), or name=<new name> "
            "runs this config in a directory of its own"
        )
