"""Progress display: a tqdm bar per epoch on a terminal, one line per epoch otherwise."""

from __future__ import annotations

import logging
import sys
from typing import Any

import torch
from tqdm import tqdm

from grab_exp.validation import check_choice

log = logging.getLogger("grab_exp")
PROGRESS_MODES = ("auto", "bar", "line", "none")
LOSS_REFRESH_STEPS = 200  # the bar's loss needs a host sync: refresh it this rarely


class Progress:
    """Reports steps and epochs; ``mode`` is auto | bar | line | none."""

    def __init__(self, mode: str = "auto", total_epochs: int = 0) -> None:
        check_choice("progress", mode, PROGRESS_MODES)
        if mode == "auto":
            mode = "bar" if sys.stderr.isatty() else "line"
        self.mode, self.total_epochs = mode, total_epochs
        self.bar: tqdm | None = None
        self.steps = 0

    def start_epoch(self, epoch: int, steps: int) -> None:
        """Open the epoch's bar (bar mode)."""
        self.steps = 0
        if self.mode == "bar":
            self.bar = tqdm(
                total=steps, desc=f"epoch {epoch + 1}/{self.total_epochs}", unit="step", leave=False
            )

    def step(self, loss: torch.Tensor) -> None:
        """Advance the bar; the running loss is shown every ``LOSS_REFRESH_STEPS`` steps."""
        if self.bar is None:
            return
        self.steps += 1
        self.bar.update()
        if self.steps % LOSS_REFRESH_STEPS == 0:
            self.bar.set_postfix(loss=f"{loss.item():.4f}")

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
