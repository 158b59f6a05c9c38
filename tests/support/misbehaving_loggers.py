"""Loggers that misbehave, for the runner's isolation of loggers (``logger.extra.<name>``).

Each is a real :class:`~grab_exp.logging.RunLogger` subclass the runner builds from a
``_target_``; what it does wrong is chosen by ``fault`` (one of :data:`FAULTS`), where in the
run by ``at`` (``start``, ``log`` or ``finish``). Each writes the events it saw to
``<run_dir>/<name>.events`` before misbehaving, so a test can tell it was called.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import torch

from grab_exp.logging import RunLogger

#: what a logger can do wrong at a call; ``odd_id`` applies to ``start`` only
FAULTS = ("mutate", "add_key", "raise", "hang", "exit", "odd_id")
ODD_IDS = {"object": object(), "path": Path("run-1"), "int": 7, "empty": ""}


class MisbehavingLogger(RunLogger):
    """A logger that does ``fault`` at ``at`` and is well behaved otherwise.

    Args:
        fault: One of :data:`FAULTS`.
        at: ``start``, ``log`` or ``finish``.
        odd_id: With ``fault=odd_id``, the key of :data:`ODD_IDS` that ``start`` returns.
        name: The file ``<run_dir>/<name>.events`` records the calls.
    """

    def __init__(
        self, fault: str, at: str = "log", odd_id: str = "object", name: str = "bad"
    ) -> None:
        self.fault, self.at, self.odd_id, self.name = fault, at, odd_id, name
        self.events: Path | None = None

    def _note(self, event: str) -> None:
        if self.events is not None:
            with self.events.open("a") as out:
                out.write(json.dumps({"event": event}) + "\n")

    def _misbehave(self, where: str, row: Any = None) -> None:
        if where != self.at:
            return
        if self.fault == "mutate" and row is not None:
            for key, value in row.items():
                if isinstance(value, float):
                    row[key] = round(value, 2)
        elif self.fault == "add_key" and row is not None:
            row["my/extra"] = 1.0
        elif self.fault == "raise":
            raise RuntimeError(f"{self.name} broke in {where}")
        elif self.fault == "hang":
            time.sleep(3600)
        elif self.fault == "exit":
            raise SystemExit(3)

    def start(self, run_dir, config, resume_id=None, rows=()):
        self.events = Path(run_dir) / f"{self.name}.events"
        self._note("start")
        if self.fault == "mutate":  # a nested value of the config it was given
            config["optimizer"]["lr"] = 99.0
        if rows:
            self._misbehave("start", rows[-1])
        self._misbehave("start")
        if self.fault == "odd_id" and self.at == "start":
            return ODD_IDS[self.odd_id]
        return resume_id or f"{self.name}-1"

    def log(self, row, epoch):
        self._note("log")
        self._misbehave("log", row)

    def finish(self, status="finished", summary=None):
        self._note("finish")
        self._misbehave("finish", summary)


class Unbuildable(MisbehavingLogger):
    """A logger whose constructor raises where ``name`` is not a string (a user's bad option)."""

    def __init__(self, fault: str, name: str = "bad") -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {type(name).__name__}\nsecond line")
        super().__init__(fault, name=name)


class ChangesProcessState(MisbehavingLogger):
    """A logger whose ``log`` changes what training reads process-wide: torch's default dtype
    (float64 weights from then on), its global random state and the working directory."""

    def log(self, row, epoch):
        torch.set_default_dtype(torch.float64)
        torch.manual_seed(epoch)
        os.chdir(Path(self.events).parent.parent if self.events else "/")


def overrides(name: str, fault: str, at: str, odd_id: str = "object") -> list[str]:
    """The command-line overrides that add this logger as ``logger.extra.<name>``."""
    node = f"+logger.extra.{name}"
    return [
        f"{node}._target_={__name__}.MisbehavingLogger",
        f"{node}.fault={fault}",
        f"{node}.at={at}",
        f"{node}.odd_id={odd_id}",
        f"{node}.name={name}",
    ]


class StopAfterFirstEpoch(RunLogger):
    """A well-behaved logger that sends its own process SIGTERM after epoch 1's row: the job
    stops as ``interrupted`` with that epoch checkpointed, and the same command resumes it."""

    def start(self, run_dir, config, resume_id=None, rows=()):
        return None

    def log(self, row, epoch):
        if epoch == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    def finish(self, status="finished", summary=None):
        pass


STOP_AFTER_FIRST_EPOCH = [f"+logger.extra.stop._target_={__name__}.StopAfterFirstEpoch"]
