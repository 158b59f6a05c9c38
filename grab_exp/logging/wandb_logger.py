"""A fail-soft Weights & Biases mirror of the local store: one W&B run per job.

:class:`WandbLogger` wraps ``wandb.init`` / ``Run.log`` / ``Run.finish``. Its mode is resolved
and validated at construction (before any training). Any exception from W&B in
:meth:`~WandbLogger.start`, :meth:`~WandbLogger.log` or :meth:`~WandbLogger.finish` (no
network, bad key, init timeout, unwritable directory) is reported once as a
:class:`WandbUnavailableWarning`, after which the logger is a no-op for the rest of the job:
training goes on with the local store.

An offline run says so once at its start and, at its end, prints the ``wandb sync`` command
that uploads it later (the run's ``wandb/offline-run-*`` folder).
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from grab_exp.logging.base import RunLogger
from grab_exp.logging.files import shown
from grab_exp.logging.wandb_mode import mode_reason, resolve_mode

log = logging.getLogger("grab_exp")


class WandbUnavailableWarning(RuntimeWarning):
    """W&B failed; this job keeps logging to the local store only."""


class WandbLogger(RunLogger):
    """One W&B run per job that never lets a W&B failure stop training.

    Args:
        project: W&B project.
        entity: W&B entity (user or team); ``None`` for the account's default.
        mode: ``auto`` (see :func:`resolve_mode`), ``online``, ``offline`` or ``disabled``.
        tags: Run tags.
        group: Run group (the experiment name).
        name: Run display name (variant-pipeline-seed).
        init_timeout: Seconds ``wandb.init`` may take before it counts as a failure.
        git_commit: The commit W&B records for the run; ``None``: W&B's own look at the
            working directory's repository (an upload sends the run's own commit).

    Raises:
        ValueError: invalid ``mode``, at construction.
    """

    def __init__(
        self,
        project: str = "grab-exp",
        entity: str | None = None,
        mode: str = "auto",
        tags: Iterable[str] = (),
        group: str | None = None,
        name: str | None = None,
        init_timeout: float = 30.0,
        git_commit: str | None = None,
    ) -> None:
        self.requested_mode = mode
        self.mode = resolve_mode(mode)
        self.project = project
        self.entity = entity
        self.tags = [str(tag) for tag in tags]
        self.group = group
        self.name = name
        self.init_timeout = float(init_timeout)
        self.git_commit = git_commit
        self.failure: str | None = None
        self._run: Any = None

    @property
    def active(self) -> bool:
        """Whether a W&B run is open and healthy."""
        return self._run is not None and self.failure is None

    @property
    def run(self) -> Any:
        """The open ``wandb`` Run, or ``None``."""
        return self._run if self.active else None

    @property
    def run_id(self) -> str | None:
        """The open run's id, or ``None``."""
        return self._run.id if self.active else None

    def start(
        self,
        run_dir: str | os.PathLike[str],
        config: Mapping[str, Any],
        resume_id: str | None = None,
        rows: Sequence[Mapping[str, Any]] = (),
    ) -> str | None:
        """Open (or, given ``resume_id``, continue) this job's W&B run.

        W&B writes under ``<run_dir>/wandb/``. Calling ``start`` again while a run is open
        returns that run's id and opens nothing. A continued run gets ``rows`` again from its
        first step on: W&B writes asynchronously, so a killed attempt may have checkpointed
        epochs that never reached its W&B files (offline the reader merges the attempts, the
        later one winning; online W&B knows which steps it already has).

        Args:
            run_dir: The job's run directory.
            config: The config: a dict, or a DictConfig (resolved here).
            resume_id: The id stored in the checkpoint by an earlier attempt of this job;
                ``None`` lets W&B pick a new one.
            rows: The checkpointed rows of a resumed job.

        Returns:
            The run id to store in the checkpoint, or ``None`` when W&B is disabled or failed.
        """
        if self.active:
            return self.run_id
        if self.mode == "disabled" or self.failure is not None:
            return None
        try:
            self._run = self._init(Path(run_dir), plain_config(config), resume_id)
        except Exception as error:
            self._fail("wandb.init", error)
            return None
        if self.mode == "offline":
            why = mode_reason(self.requested_mode)
            log.info("W&B is offline (%s): the run is written to %s", why, shown(self.sync_dir))
        first_step = getattr(self._run, "starting_step", 0)
        for row in rows:
            if row["epoch"] >= first_step:
                self.log(row, row["epoch"])
        return self.run_id

    @property
    def sync_dir(self) -> Path | None:
        """The open run's own folder (``<run_dir>/wandb/offline-run-*``), or ``None``."""
        return Path(self._run.dir).parent if self.active else None

    def log(self, metrics: Mapping[str, Any], epoch: int) -> None:
        """Log one epoch's metrics with ``epoch`` as the W&B step; ``None`` values are dropped.

        The step is committed at once (``commit=True``), so it reaches the ``.wandb`` file
        without waiting for the next epoch.
        """
        if not self.active:
            return
        values = {key: value for key, value in metrics.items() if value is not None}
        try:
            self._run.log(values, step=int(epoch), commit=True)
        except Exception as error:
            self._fail("wandb.log", error)

    def save_files(self, files: Mapping[str, bytes]) -> None:
        """Attach ``files`` (path in the run directory -> its bytes) to the open run: copies in
        the run's files folder, in the same layout, which W&B uploads when the run ends."""
        if not self.active:
            return
        try:
            for name, data in files.items():
                copy = Path(self._run.dir) / name
                copy.parent.mkdir(parents=True, exist_ok=True)
                copy.write_bytes(data)
        except Exception as error:
            self._fail("saving files", error)

    def finish(self, status: str = "finished", summary: Mapping[str, Any] | None = None) -> None:
        """Finish the run (exit code 0 when ``status`` is ``finished``, else 1), with
        ``status`` and ``summary``'s ``wall_time_s`` in its W&B summary; later calls do
        nothing."""
        if not self.active:
            return
        sync_dir = self.sync_dir
        run, self._run = self._run, None
        extra = {"wall_time_s": (summary or {}).get("wall_time_s")}
        try:
            run.summary.update({"status": status, **{k: v for k, v in extra.items() if v}})
            run.finish(exit_code=0 if status == "finished" else 1)
        except Exception as error:
            self._fail("wandb.finish", error)
            return
        if self.mode == "offline":
            log.info("upload this W&B run with: wandb sync %s", shown(sync_dir))

    def _init(self, run_dir: Path, config: dict[str, Any], run_id: str | None) -> Any:
        import wandb

        run_dir.mkdir(parents=True, exist_ok=True)
        return wandb.init(
            dir=str(run_dir),
            id=run_id,
            resume="allow",
            project=self.project,
            entity=self.entity,
            group=self.group,
            name=self.name,
            tags=self.tags,
            config=config,
            mode=self.mode,
            reinit="create_new",
            settings=wandb.Settings(**quiet_settings(self.init_timeout), **self._git()),
        )

    def _git(self) -> dict[str, Any]:
        """``wandb.Settings`` keywords that record :attr:`git_commit` instead of W&B's look."""
        return {} if self.git_commit is None else {"git_commit": self.git_commit}

    def _fail(self, where: str, error: BaseException) -> None:
        """Record the first failure and warn about it; the logger is a no-op from now on."""
        if self.failure is not None:
            return
        first_line = (str(error).strip().splitlines() or [""])[0]  # pydantic's run to 4 lines
        self.failure = f"{where} failed: {type(error).__name__}: {first_line}"
        warnings.warn(
            f"W&B disabled for the rest of this job ({self.failure}); "
            "metrics still go to the local store (metrics.csv, summary.json).",
            WandbUnavailableWarning,
            stacklevel=3,
        )


def quiet_settings(init_timeout: float) -> dict[str, Any]:
    """``wandb.Settings`` keywords: quiet, no console capture, no system-metrics sampler.

    ``x_transaction_log_flush_interval`` (1 s) makes each committed epoch reach the ``.wandb``
    file promptly, so a killed job loses at most the last second. Keys this W&B version does
    not know are left out.
    """
    import wandb

    wanted: dict[str, Any] = {
        "silent": True,
        "console": "off",
        "save_code": False,
        "x_disable_stats": True,
        "init_timeout": init_timeout,
        "x_transaction_log_flush_interval": 1.0,
    }
    known = getattr(wandb.Settings, "model_fields", wanted)
    return {key: value for key, value in wanted.items() if key in known}


def plain_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A plain ``dict`` of ``config``; an OmegaConf ``DictConfig`` is resolved first."""
    from omegaconf import DictConfig, OmegaConf

    if isinstance(config, DictConfig):
        return OmegaConf.to_container(config, resolve=True)  # type: ignore[return-value]
    return dict(config)


def build_wandb_logger(
    cfg: Mapping[str, Any] | None, group: str | None, name: str | None
) -> WandbLogger | None:
    """Build the logger from the ``logger.wandb`` config node, or ``None`` when not enabled.

    Args:
        cfg: The ``logger.wandb`` node (DictConfig or dict) with ``enabled``, ``project``,
            ``entity``, ``mode`` and ``tags``.
        group: W&B group (the experiment name).
        name: W&B run name (variant-pipeline-seed).

    Raises:
        ValueError: invalid ``logger.wandb.mode``.
    """
    if cfg is None or not cfg.get("enabled", False):
        return None
    options = {key: cfg[key] for key in ("project", "entity", "mode") if key in cfg}
    return WandbLogger(**options, tags=tuple(cfg.get("tags") or ()), group=group, name=name)
