"""Progress display: a tqdm bar per epoch on a terminal; otherwise lines, one early in the
first epoch, one every :data:`LINE_EVERY_STEPS` steps and one per epoch."""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

import torch
from tqdm import tqdm

from grab_exp.runner.config.schema import PROGRESS_MODES
from grab_exp.validation import check_choice

log = logging.getLogger("grab_exp")
LOSS_REFRESH_STEPS = 200  # the bar's loss needs a host sync: refresh it this rarely
#: line mode: a step line after this many steps of the first epoch (the job is running) ...
LINE_FIRST_STEP = 10
#: ... and every this many steps of every epoch (no loss: it would make the host wait)
LINE_EVERY_STEPS = 1000


class Progress:
    """Reports steps and epochs; ``mode`` is auto | bar | line | none."""

    def __init__(self, mode: str = "auto", total_epochs: int = 0) -> None:
        check_choice("progress", mode, PROGRESS_MODES)
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "line"
        self.mode, self.total_epochs = mode, total_epochs
        self.bar: tqdm | None = None
        self.steps = 0
        self.epoch, self.epoch_steps, self.started = 0, 0, 0.0
        self.first_epoch: int | None = None

    def start_epoch(self, epoch: int, steps: int) -> None:
        """Open the epoch's bar (bar mode); remember the epoch's size (line mode)."""
        self.steps = 0
        self.epoch, self.epoch_steps, self.started = epoch, steps, time.perf_counter()
        if self.first_epoch is None:
            self.first_epoch = epoch
        if self.mode == "bar":
            self.bar = tqdm(
                total=steps, desc=f"epoch {epoch + 1}/{self.total_epochs}", unit="step", leave=False
            )

    def step(self, loss: torch.Tensor) -> None:
        """Advance the bar (the running loss every ``LOSS_REFRESH_STEPS`` steps), or print a
        step line when one is due (line mode; no host read)."""
        self.steps += 1
        if self.bar is not None:
            self.bar.update()
            if self.steps % LOSS_REFRESH_STEPS == 0:
                self.bar.set_postfix(loss=f"{loss.item():.4f}")
        elif self.mode == "line" and self._line_due():
            seconds = time.perf_counter() - self.started
            log.info(
                "epoch %d/%d  step %d/%d  %.1fs (%.0f steps/s)",
                self.epoch + 1,
                self.total_epochs,
                self.steps,
                self.epoch_steps,
                seconds,
                self.steps / max(seconds, 1e-9),
            )

    def _line_due(self) -> bool:
        early = self.epoch == self.first_epoch and self.steps == LINE_FIRST_STEP
        return early or self.steps % LINE_EVERY_STEPS == 0

    def end_epoch(self, row: dict[str, Any]) -> None:
        """Close the bar and print the epoch's summary line (bar and line modes)."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        if self.mode != "none":
            log.info(
                "epoch %d/%d  train/loss %.4f  train/acc %.4f  test/loss %.4f  test/acc %.4f  "
                "%.1fs",
                row["epoch"],
                self.total_epochs,
                row["train/loss"],
                row["train/acc"],
                row["test/loss"],
                row["test/acc"],
                row["time/epoch_s"],
            )
