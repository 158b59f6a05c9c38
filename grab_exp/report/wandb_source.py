"""The tidy run frame from W&B's public API: ``wandb.Api().runs(...)`` and each run's history.

:func:`frame_from_api_runs` converts run objects with the public API's interface (``id``,
``name``, ``state``, ``group``, ``job_type``, ``config``, ``path`` and ``scan_history()``),
as documented for ``wandb.apis.public.Run``; :func:`frame_from_wandb` fetches them (this
needs the network and a W&B API key).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

import pandas as pd

from grab_exp.report.collect import (
    ID_COLUMNS,
    RunLoadError,
    check_metrics,
    concat_runs,
    drop_duplicate_runs,
    warn_skip,
)

RUN_NAME = re.compile(r"^(?P<variant>[^-]+)-(?P<pipeline>[^-]+)-seed(?P<seed>\d+)$")
_PIPELINES = {"ClassicPipeline": "classic", "FunctionalPipeline": "functional"}


def parse_wandb_path(path: str) -> tuple[str, str | None]:
    """``ENTITY/PROJECT[/GROUP]`` -> ``("ENTITY/PROJECT", GROUP or None)``.

    Raises:
        ValueError: fewer than two non-empty parts.
    """
    parts = path.strip("/").split("/", 2)
    if len(parts) < 2 or not all(parts[:2]):
        raise ValueError(f"--wandb wants ENTITY/PROJECT[/GROUP], got {path!r}")
    return "/".join(parts[:2]), (parts[2] if len(parts) == 3 and parts[2] else None)


def fetch_runs(path: str, api: Any = None) -> Iterable[Any]:
    """The runs of ``ENTITY/PROJECT[/GROUP]`` from the public API (network)."""
    if api is None:
        import wandb

        api = wandb.Api()
    project, group = parse_wandb_path(path)
    return api.runs(project, filters={"group": group} if group else None)


def frame_from_wandb(path: str, api: Any = None) -> pd.DataFrame:
    """The tidy frame of the finished training runs of ``ENTITY/PROJECT[/GROUP]``."""
    return frame_from_api_runs(fetch_runs(path, api))


def frame_from_api_runs(runs: Iterable[Any]) -> pd.DataFrame:
    """Convert public-API runs to the tidy frame of :mod:`grab_exp.report.collect`.

    Report runs (``job_type == "report"``) are ignored; unfinished runs and runs whose
    identity or history cannot be read are skipped with a warning naming them.
    """
    frames = []
    for run in runs:
        if getattr(run, "job_type", None) == "report":
            continue
        try:
            frames.append(api_run_frame(run))
        except RunLoadError as error:
            warn_skip(str(error))
    return drop_duplicate_runs(concat_runs(frames))


def api_run_frame(run: Any) -> pd.DataFrame:
    """One public-API run as a tidy frame.

    Raises:
        RunLoadError: the run is unfinished, its variant/pipeline/seed are unknown, or its
            history lacks the metrics (the message names the run).
    """
    ref = run_ref(run)
    if run.state != "finished":
        raise RunLoadError(f"skipping unfinished W&B run {ref} (state {run.state!r})")
    config = dict(run.config or {})
    variant, pipeline, seed = identify(run.name, config, ref)
    history = history_frame(run.scan_history(), ref)
    ids = {
        "run": ref,
        "variant": variant,
        "pipeline": pipeline,
        "seed": seed,
        "device": infer_device(history, config),
    }
    columns = [c for c in history.columns if c not in ID_COLUMNS]
    return history.assign(**ids)[[*ID_COLUMNS, *columns]]


def run_ref(run: Any) -> str:
    """``wandb:ENTITY/PROJECT/ID`` (or ``wandb:ID`` when the path is unknown)."""
    path = getattr(run, "path", None)
    return "wandb:" + ("/".join(map(str, path)) if path else str(run.id))


def identify(name: str | None, config: dict[str, Any], ref: str) -> tuple[str, str, int]:
    """``(variant, pipeline, seed)`` from the run name ``<variant>-<pipeline>-seed<k>``
    that the runner gives, else from the config's ``balance``/``pipeline`` targets."""
    match = RUN_NAME.match(name or "")
    if match:
        return match["variant"], match["pipeline"], int(match["seed"])
    try:
        balance = str(config["balance"]["_target_"]).rsplit(".", 1)[-1]
        pipeline = str(config["pipeline"]["_target_"]).rsplit(".", 1)[-1]
        return _registry_name(balance), _PIPELINES[pipeline], int(config["seed"])
    except (KeyError, TypeError, ValueError):
        raise RunLoadError(
            f"skipping W&B run {ref}: cannot tell its variant/pipeline/seed from name "
            f"{name!r} or config"
        ) from None


def _registry_name(class_name: str) -> str:
    from grab_exp.balance import Balance

    names = {cls.__name__: key for key, cls in Balance.registry.items()}
    return names[class_name]


def history_frame(rows: Iterable[dict[str, Any]], ref: str) -> pd.DataFrame:
    """The run's epoch rows (``epoch`` from the logged key, else ``_step``), checked; an
    epoch logged twice (a resumed run) keeps its later row."""
    kept = []
    for row in rows:
        if row.get("train/loss") is None:
            continue
        epoch = row.get("epoch", row.get("_step"))
        kept.append({"epoch": epoch, **{k: v for k, v in row.items() if not k.startswith("_")}})
    frame = pd.DataFrame(kept)
    if frame.empty:
        frame = pd.DataFrame(columns=["epoch"])
    else:  # a resumed run may log an epoch twice: the later row wins
        frame = frame.drop_duplicates("epoch", keep="last")
    return check_metrics(frame, f"W&B run {ref}", "history")


def infer_device(history: pd.DataFrame, config: dict[str, Any]) -> str:
    """``cuda`` when CUDA memory was logged, else the configured device (``cpu`` for auto)."""
    cuda = history.get("mem/peak_cuda_mb")
    if cuda is not None and cuda.notna().any():
        return "cuda"
    device = str(config.get("device", "auto"))
    return "cpu" if device == "auto" else device
