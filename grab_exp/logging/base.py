"""The one interface of the loggers a job writes to besides its local store.

The local store (:class:`~grab_exp.logging.local.LocalStore`: ``metrics.csv``,
``summary.json``) is always written; every other destination is a :class:`RunLogger`, built from
the ``logger`` config group: W&B (:class:`~grab_exp.logging.wandb_logger.WandbLogger`, from
``logger.wandb``) and any ``logger.extra.<name>`` node with a ``_target_``. A new logger
(TensorBoard, a database) is one module with a subclass plus one ``conf/logger/<name>.yaml``
(``docs/your-experiment.md``).
"""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any


class RunLogger(ABC):
    """One run per job in some destination; a failure there should not stop training.

    The runner calls :meth:`start` once per attempt of a job (a resumed job again, with the id
    :meth:`start` returned before and the rows its checkpoint holds), :meth:`log` after every
    epoch, and :meth:`finish` once, however the job ends. Each call gets copies of its own and
    is bounded in time (:class:`~grab_exp.logging.guard.GuardedLogger`): a logger that raises or
    hangs is named in one warning and skipped from then on; the run goes on untouched.
    """

    @abstractmethod
    def start(
        self,
        run_dir: str | os.PathLike[str],
        config: Mapping[str, Any],
        resume_id: str | None = None,
        rows: Sequence[Mapping[str, Any]] = (),
    ) -> str | None:
        """Open this job's run, or continue the one ``resume_id`` names.

        Args:
            run_dir: The job's run directory (a logger may write under it).
            config: The job's resolved config, with its ``identity``.
            resume_id: What an earlier attempt's :meth:`start` returned (kept in the
                checkpoint); ``None`` for a new job.
            rows: The rows of the epochs a resumed job already finished (``[]`` if new): the
                rows a killed attempt may not have delivered.

        Returns:
            An id to keep in the checkpoint for a later attempt (a non-empty ``str``; anything
            else refuses the job before its first epoch), or ``None``.
        """

    @abstractmethod
    def log(self, row: Mapping[str, Any], epoch: int) -> None:
        """One finished epoch's row (``metrics.csv``'s columns), ``epoch`` counted from 1."""

    @abstractmethod
    def finish(self, status: str = "finished", summary: Mapping[str, Any] | None = None) -> None:
        """Close the run: ``status`` is ``finished``, ``failed`` or ``interrupted``; ``summary``
        holds ``wall_time_s`` and, when an epoch finished, ``final`` (its last row)."""
