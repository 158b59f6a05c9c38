"""What a run is: the ``identity`` block that the runner writes into ``summary.json`` and the W&B
run's config (:func:`run_identity`), and the same dict read back from a run (:func:`read_identity`),
derived for runs written before the block existed.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from grab_exp.conf import CONF_DIR
from grab_exp.runner.rundir.resolvers import register_resolvers, settings_hash

#: The keys of a run's identity, in order.
IDENTITY_KEYS = ("experiment", "variant", "pipeline", "optimizer", "arm", "row", "batch_size")
IDENTITY_KEYS += ("world_size", "seed", "overrides_hash")
#: override keys that identity fields name besides the run directory's path keys
NAMED_KEYS = ("optimizer", "arm", "batch_size")
_RUN_DIR = re.compile(r"^seed\d+(?:-(?P<hash>[0-9a-f]+))?$")


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


def read_identity(
    summary: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
) -> dict[str, Any]:
    """A run's identity: the ``identity`` block of its summary (or W&B config), else derived.

    Runs written before the block existed get the same dict from the summary's ``variant``,
    ``pipeline``, ``seed``, ``world_size``; the resolved config's ``name``, ``batch_size``,
    ``seed`` and ``_target_`` classes (named after their ``conf/`` file); and, with ``run_dir``,
    its ``.hydra/`` choices (``arm``, ``row``, ``optimizer``), ``[+]row=``/``arm=`` overrides and
    the directory's hash suffix. What an old run did not record is ``None``.

    Args:
        summary: The run's ``summary.json`` (``{}`` for a W&B run).
        config: The run's resolved config (a W&B run's ``config``); default with ``run_dir``:
            its ``.hydra/config.yaml``.
        run_dir: The local run directory.

    Returns:
        ``{key: value for key in IDENTITY_KEYS}``.

    Raises:
        ValueError: an old run whose variant or seed cannot be told, or unreadable Hydra files.
    """
    block = summary.get("identity") or (config or {}).get("identity")
    if isinstance(block, Mapping):
        return {key: block.get(key) for key in IDENTITY_KEYS}
    try:
        config = read_config(run_dir) if config is None and run_dir is not None else config
        identity = _derive_identity(summary, config or {}, run_dir)
    except (OSError, ValueError) as error:
        raise ValueError(f"unreadable Hydra files ({error})") from None
    missing = [key for key in ("variant", "seed") if identity[key] is None]
    if missing:
        raise ValueError(f"cannot tell its {'/'.join(missing)}")
    return identity


def read_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's resolved config (``.hydra/config.yaml``), ``None`` when it has none."""
    path = Path(run_dir, ".hydra", "config.yaml")
    if not path.is_file():
        return None
    register_resolvers()  # e.g. the lr of the square-root rule
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def _derive_identity(summary: Mapping, config: Mapping, run_dir: Any) -> dict[str, Any]:
    """The identity of a run written before the identity block (see :func:`read_identity`)."""
    choices, overrides = _hydra_choices(Path(run_dir, ".hydra")) if run_dir else ({}, {})
    seed, batch_size = summary.get("seed", config.get("seed")), config.get("batch_size")
    match = _RUN_DIR.match(Path(run_dir).name) if run_dir is not None else None
    return {
        "experiment": config.get("name"),
        "variant": summary.get("variant") or _choice("balance", choices, config),
        "pipeline": summary.get("pipeline") or _choice("pipeline", choices, config),
        "optimizer": _choice("optimizer", choices, config),
        "arm": choices.get("arm") or overrides.get("arm"),
        "row": choices.get("row") or overrides.get("row"),
        "batch_size": None if batch_size is None else int(batch_size),
        "world_size": _world_size(summary, config),
        "seed": None if seed is None else int(seed),
        "overrides_hash": (match["hash"] or "") if match else None,
    }


def _hydra_choices(hydra_dir: Path) -> tuple[dict[str, Any], dict[str, str]]:
    """Hydra's group choices (``hydra.yaml``) and the overrides (``overrides.yaml``)."""
    choices, overrides = {}, []
    if (hydra_dir / "hydra.yaml").is_file():
        hydra = OmegaConf.load(hydra_dir / "hydra.yaml")
        choices = OmegaConf.to_container(hydra.hydra.runtime.choices)
    if (hydra_dir / "overrides.yaml").is_file():
        overrides = OmegaConf.to_container(OmegaConf.load(hydra_dir / "overrides.yaml"))
    pairs = (str(o).split("=", 1) for o in overrides if "=" in str(o))
    return choices, {key.lstrip("+~"): value for key, value in pairs}


def _choice(group: str, choices: Mapping, config: Mapping) -> str | None:
    """A config group's option: Hydra's choice, else the ``conf/<group>/`` file whose
    ``_target_`` class the config names (``MeanBalance`` -> ``mean``)."""
    if choices.get(group):
        return str(choices[group])
    target = (config.get(group) or {}).get("_target_")
    return _options_by_class(group).get(str(target).rsplit(".", 1)[-1]) if target else None


#: classes renamed since runs were logged: old name -> the name their ``conf/`` file has now
RENAMED_CLASSES = {"FunctionalPipeline": "PerSamplePipeline"}


def conf_choices(file: str) -> dict[str, str | None]:
    """What the defaults list of ``conf/<file>.yaml`` chooses, group -> option, from its
    ``group: option``, ``override /group: option`` and ``/group: option`` entries, e.g.
    ``conf_choices("row/mean") == {"balance": "mean", "pipeline": "functional"}``."""
    choices = {}
    for entry in OmegaConf.load(CONF_DIR / f"{file}.yaml").get("defaults", []):
        for key, value in entry.items() if isinstance(entry, DictConfig) else ():
            choices[str(key).removeprefix("override ").strip().lstrip("/")] = value
    return choices


def _options_by_class(group: str) -> dict[str, str]:
    """``_target_`` class name -> option name of every file of ``conf/<group>/`` with one (old
    names of :data:`RENAMED_CLASSES` too)."""
    named = {}
    for path in sorted((CONF_DIR / group).glob("*.yaml")):
        target = OmegaConf.load(path).get("_target_")
        if target:
            named.setdefault(str(target).rsplit(".", 1)[-1], path.stem)
    named.update({old: named[new] for old, new in RENAMED_CLASSES.items() if new in named})
    return named


def _world_size(summary: Mapping, config: Mapping) -> int | None:
    """Data-parallel runs record it; a single process is 1; unknown is ``None``."""
    if summary.get("world_size"):
        return int(summary["world_size"])
    distributed = config.get("distributed") or {}
    workers = distributed.get("simulate_workers") or distributed.get("workers")
    if workers:
        return int(workers)
    return None if distributed.get("enabled") else 1
