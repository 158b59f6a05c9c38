"""Upload the report to a W&B summary run (``job_type="report"``); works offline too."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from grab_exp.logging.wandb_logger import quiet_settings
from grab_exp.logging.wandb_mode import resolve_mode

REPORT_JOB_TYPE = "report"


def wandb_table(frame: pd.DataFrame) -> Any:
    """A ``wandb.Table`` of ``frame`` (missing numbers become ``None``)."""
    import wandb

    clean = frame.astype(object).where(frame.notna(), None)
    return wandb.Table(columns=[str(c) for c in clean.columns], data=clean.values.tolist())


def log_report(
    tables: Mapping[str, pd.DataFrame],
    images: Mapping[str, str | os.PathLike[str]],
    out_dir: str | os.PathLike[str],
    project: str = "grab-exp",
    entity: str | None = None,
    group: str | None = None,
    mode: str = "auto",
) -> str:
    """Log ``tables`` as W&B Tables and ``images`` (PNG paths) as W&B Images to a new run.

    Args:
        tables: Name -> frame, e.g. ``{"table1": ..., "table1_vs_paper": ...}``.
        images: Name -> PNG file, e.g. ``{"figure1": ".../figure1.png"}``.
        out_dir: Where W&B writes (``<out_dir>/wandb/``).
        project: W&B project.
        entity: W&B entity; ``None`` for the default.
        group: W&B group (the sweep's experiment name, so the report sits with its runs).
        mode: ``auto`` / ``online`` / ``offline`` (see :func:`resolve_mode`).

    Returns:
        The summary run's id.
    """
    import wandb

    Path(out_dir).mkdir(parents=True, exist_ok=True)
    run = wandb.init(
        dir=str(out_dir),
        project=project,
        entity=entity,
        group=group,
        job_type=REPORT_JOB_TYPE,
        name=f"report-{group}" if group else "report",
        mode=resolve_mode(mode),
        reinit="create_new",
        settings=wandb.Settings(**quiet_settings(60.0)),
    )
    try:
        payload = {name: wandb_table(frame) for name, frame in tables.items()}
        payload |= {name: wandb.Image(str(path)) for name, path in images.items()}
        run.log(payload)
        run_id = run.id
    except BaseException:
        run.finish(exit_code=1)
        raise
    run.finish()
    return run_id
