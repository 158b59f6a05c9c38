"""The one reader of runs: run directories (``metrics.csv``, ``summary.json``, ``.hydra/``)
into the tidy frame of :mod:`grab_exp.report.frames`, and every run's identity, local or W&B.

Runs that cannot be used (unfinished, missing or corrupt files, kept-aside ``*.old<k>``
copies) are skipped with a :class:`ReportWarning` that names their directory.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import OmegaConf

from grab_exp.logging.files import shown
from grab_exp.report.frames import (
    ID_COLUMNS,
    RunLoadError,
    check_complete,
    check_metrics,
    concat_runs,
    drop_duplicate_runs,
    metric_columns,
    warn_skip,
)

METRICS_FILE = "metrics.csv"
SUMMARY_FILE = "summary.json"
#: The keys of a run's identity block, in order (see :func:`run_identity`).
IDENTITY_KEYS = ("experiment", "variant", "pipeline", "optimizer", "arm", "row", "batch_size")
IDENTITY_KEYS += ("world_size", "seed", "overrides_hash")
_KEPT_ASIDE = re.compile(r"\.old\d+$")
_RUN_DIR = re.compile(r"^seed\d+(?:-(?P<hash>[0-9a-f]+))?$")
_PIPELINES = {"ClassicPipeline": "classic", "FunctionalPipeline": "functional"}
_OPTIMIZERS = {"SGD": "sgd", "Adam": "adam", "VRSGD": "vr_sgd", "VRMomentum": "vr_momentum"}
_OPTIMIZERS |= {"VRAdam": "vr_adam"}


def run_identity(
    summary: Mapping[str, Any],
    config: Mapping[str, Any] | None = None,
    run_dir: str | os.PathLike[str] | None = None,
    where: str | None = None,
) -> dict[str, Any]:
    """A run's identity: the ``identity`` block of its summary (or W&B config), else derived.

    Runs written before the block existed get the same dict from the summary's ``variant``,
    ``pipeline``, ``seed``, ``world_size``; the resolved config's ``name``, ``batch_size``,
    ``seed`` and ``_target_`` classes; and, with ``run_dir``, its ``.hydra/`` choices
    (``arm``, ``row``, ``optimizer``), ``[+]row=``/``arm=`` overrides and the directory's hash
    suffix. What an old run did not record is ``None``.

    Args:
        summary: The run's ``summary.json`` (``{}`` for a W&B run).
        config: The run's resolved config (a W&B run's ``config``); default with ``run_dir``:
            its ``.hydra/config.yaml``.
        run_dir: The local run directory.
        where: The run in error messages (default: ``run_dir``, else ``a W&B run``).

    Returns:
        ``{key: value for key in IDENTITY_KEYS}``.

    Raises:
        RunLoadError: an old run whose variant or seed cannot be told, or unreadable Hydra files.
    """
    block = summary.get("identity") or (config or {}).get("identity")
    if isinstance(block, Mapping):
        return {key: block.get(key) for key in IDENTITY_KEYS}
    where = where or ("a W&B run" if run_dir is None else str(run_dir))
    try:
        config = read_config(run_dir) if config is None and run_dir is not None else config
        identity = _derive_identity(summary, config or {}, run_dir)
    except (OSError, ValueError) as error:
        raise RunLoadError(f"skipping {where}: unreadable Hydra files ({error})") from None
    missing = [key for key in ("variant", "seed") if identity[key] is None]
    if missing:
        raise RunLoadError(f"skipping {where}: cannot tell its {'/'.join(missing)}")
    return identity


def _derive_identity(summary: Mapping, config: Mapping, run_dir: Any) -> dict[str, Any]:
    """The identity of a run written before the identity block (see :func:`run_identity`)."""
    choices, overrides = _hydra_choices(Path(run_dir, ".hydra")) if run_dir else ({}, {})
    seed, batch_size = summary.get("seed", config.get("seed")), config.get("batch_size")
    match = _RUN_DIR.match(Path(run_dir).name) if run_dir is not None else None
    return {
        "experiment": config.get("name"),
        "variant": summary.get("variant") or _choice("balance", choices, config, _balances()),
        "pipeline": summary.get("pipeline") or _choice("pipeline", choices, config, _PIPELINES),
        "optimizer": _choice("optimizer", choices, config, _OPTIMIZERS),
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


def _choice(group: str, choices: Mapping, config: Mapping, names: Mapping) -> str | None:
    """A config group's option: Hydra's choice, else named after the config's ``_target_``."""
    if choices.get(group):
        return str(choices[group])
    target = (config.get(group) or {}).get("_target_")
    return names.get(str(target).rsplit(".", 1)[-1]) if target else None


def _balances() -> dict[str, str]:
    """Ordering class name -> registry name (e.g. ``MeanBalance`` -> ``mean``)."""
    import grab_exp.distributed  # noqa: F401  (registers the data-parallel orderings)
    from grab_exp.balance import Ordering

    return {cls.__name__: name for name, cls in Ordering.registry.items()}


def _world_size(summary: Mapping, config: Mapping) -> int | None:
    """Data-parallel runs record it; a single process is 1; unknown is ``None``."""
    if summary.get("world_size"):
        return int(summary["world_size"])
    distributed = config.get("distributed") or {}
    workers = distributed.get("simulate_workers") or distributed.get("workers")
    if workers:
        return int(workers)
    return None if distributed.get("enabled") else 1


def read_config(run_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The run's resolved config (``.hydra/config.yaml``), ``None`` when it has none."""
    path = Path(run_dir, ".hydra", "config.yaml")
    if not path.is_file():
        return None
    from grab_exp.runner.resolvers import register_resolvers

    register_resolvers()  # e.g. the lr of the square-root rule
    return OmegaConf.to_container(OmegaConf.load(path), resolve=True)


def find_run_dirs(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Run directories at or under ``paths``: every folder holding a ``summary.json``.

    Args:
        paths: Run directories or sweep directories (searched recursively).

    Returns:
        The run directories, sorted, each once (``*.old<k>`` and summary-less ones: warned).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    found: set[Path] = set()
    for path in map(Path, paths):
        if not path.exists():
            raise FileNotFoundError(f"no such run or sweep directory: {path}")
        found.update(summary.parent.resolve() for summary in path.rglob(SUMMARY_FILE))
        marks = [*path.rglob(METRICS_FILE), *path.rglob(".hydra")]
        for orphan in sorted({mark.parent.resolve() for mark in marks} - found):
            warn_skip(
                f"skipping {orphan}: no {SUMMARY_FILE} (a job that never started, or stopped first)"
            )
    kept = []
    for run_dir in sorted(found):
        if _KEPT_ASIDE.search(run_dir.name):
            warn_skip(f"skipping {run_dir}: an earlier run kept aside by overwrite=true")
        else:
            kept.append(run_dir)
    return kept


def read_run(run_dir: str | os.PathLike[str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """One finished run: its tidy frame and its identity (:func:`run_identity`).

    Raises:
        RunLoadError: the run is unfinished (e.g. ``interrupted``), its identity cannot be told,
            or its ``summary.json`` / ``metrics.csv`` is missing, corrupt or incomplete.
    """
    run_dir = Path(run_dir)
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except (OSError, ValueError) as error:
        raise RunLoadError(f"skipping {run_dir}: unreadable {SUMMARY_FILE} ({error})") from None
    if not isinstance(summary, dict):
        raise RunLoadError(f"skipping {run_dir}: {SUMMARY_FILE} is not a JSON object")
    if (status := summary.get("status")) != "finished":
        raise RunLoadError(f"skipping unfinished run {run_dir} (status {status!r})")
    identity = run_identity(summary, run_dir=run_dir)
    metrics = check_complete(read_metrics(run_dir), summary.get("final") or {}, run_dir)
    ids = {"run": shown(run_dir), **{key: identity[key] for key in ("variant", "pipeline", "seed")}}
    ids["device"] = str(summary.get("device", "unknown"))
    return metrics.assign(**ids)[[*ID_COLUMNS, *metric_columns(metrics)]], identity


def load_run(run_dir: str | os.PathLike[str]) -> pd.DataFrame:
    """One finished run's tidy frame (:func:`read_run` without the identity)."""
    return read_run(run_dir)[0]


def read_metrics(run_dir: Path) -> pd.DataFrame:
    """``metrics.csv`` of ``run_dir`` as numbers, one row per completed epoch."""
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise RunLoadError(f"skipping {run_dir}: no {METRICS_FILE}")
    try:
        metrics = pd.read_csv(path)
    except (OSError, ValueError) as error:  # pandas' parser errors are ValueErrors
        raise RunLoadError(f"skipping {run_dir}: corrupt {METRICS_FILE} ({error})") from None
    return check_metrics(metrics, run_dir, METRICS_FILE)


def read_runs(paths: Iterable[str | os.PathLike[str]]) -> list[tuple[pd.DataFrame, dict]]:
    """:func:`read_run` of every usable run at or under ``paths``, in directory order.

    Raises:
        FileNotFoundError: a path does not exist.
    """
    runs = []
    for run_dir in find_run_dirs(paths):
        try:
            runs.append(read_run(run_dir))
        except RunLoadError as error:
            warn_skip(str(error))
    return runs


def load_runs(paths: Iterable[str | os.PathLike[str]]) -> pd.DataFrame:
    """The tidy frame of the usable runs at or under ``paths``; of two runs sharing variant,
    pipeline and seed, the later one is dropped with a warning (pass one sweep's runs).

    Raises:
        FileNotFoundError: a path does not exist.
    """
    return drop_duplicate_runs(concat_runs([frame for frame, _ in read_runs(paths)]))
