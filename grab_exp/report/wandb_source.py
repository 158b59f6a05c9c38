"""The tidy run frame from W&B's public API: ``wandb.Api().runs(...)`` and each run's history.

:func:`frame_from_api_runs` converts run objects with the public API's interface (``id``,
``state``, ``group``, ``job_type``, ``config``, ``path`` and ``scan_history()``), as
documented for ``wandb.apis.public.Run``; :func:`frame_from_wandb` fetches them (this needs
the network and a W&B API key). A run's identity comes from its config's ``identity`` block
through :func:`grab_exp.report.collect.run_identity` (older runs: derived from the config).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pandas as pd

from grab_exp.report.collect import run_identity
from grab_exp.report.frames import (
    ID_COLUMNS,
    RunLoadError,
    check_metrics,
    concat_runs,
    drop_duplicate_runs,
    warn_skip,
)


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
        RunLoadError: the run is unfinished, its identity cannot be told, or its history
            lacks the metrics (the message names the run).
    """
    ref = run_ref(run)
    if run.state != "finished":
        raise RunLoadError(f"skipping unfinished W&B run {ref} (state {run.state!r})")
    config = dict(run.config or {})
    identity = run_identity({}, config, where=f"W&B run {ref}")
    history = history_frame(run.scan_history(), ref)
    ids = {key: identity[key] for key in ("variant", "pipeline", "seed")}
    ids = {"run": ref, **ids, "device": infer_device(history, config)}
    columns = [c for c in history.columns if c not in ID_COLUMNS]
    return history.assign(**ids)[[*ID_COLUMNS, *columns]]


def run_ref(run: Any) -> str:
    """``wandb:ENTITY/PROJECT/ID`` (or ``wandb:ID`` when the path is unknown)."""
    path = getattr(run, "path", None)
    return "wandb:" + ("/".join(map(str, path)) if path else str(run.id))


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
