"""A job's dataset: loaded with progress and a stop signal honoured, then checked.

The loader (``dataset._target_``, the project's or the user's) runs in a daemon thread while the
main thread waits: every :data:`PROGRESS_S` seconds it says how long the load has taken, and a
SIGTERM or SIGINT stops the job at once (``interrupted``; the loader is abandoned). What the
loader returns is checked (:func:`grab_exp.data.checks.check_loaded`) before it moves to the
device.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import torch
from hydra.utils import instantiate
from omegaconf import DictConfig

from grab_exp.data.arrays import ArrayData
from grab_exp.data.checks import check_loaded
from grab_exp.runner.training.signals import check_stop

log = logging.getLogger("grab_exp")
#: seconds between two "still loading" lines
PROGRESS_S = 10.0
_POLL_S = 0.05


def load_dataset(cfg: DictConfig, device: torch.device, choice: str | None) -> ArrayData:
    """The job's dataset, checked, on ``device``.

    Args:
        cfg: The job's config (its ``dataset`` node is instantiated).
        device: Where the tensors go.
        choice: The ``dataset`` option chosen (``image_folder``, ...), for the messages.

    Raises:
        DataError: the loaded data cannot be trained on (one line naming the dataset).
        JobInterrupted: a stop signal arrived during the load.
    """
    target = cfg.dataset.get("_target_")
    setting = f"dataset={choice} ({target})" if choice else f"dataset ({target})"
    data = _waited(lambda: instantiate(cfg.dataset), setting)
    return check_loaded(data, setting).to(device)


def _waited(load: Any, setting: str) -> Any:
    """``load()`` in a thread, waited for with progress lines and stop signals honoured."""
    outcome: dict[str, Any] = {}

    def target() -> None:
        try:
            outcome["result"] = load()
        except BaseException as error:
            outcome["error"] = error

    thread = threading.Thread(target=target, name="dataset load", daemon=True)
    began = next_line = time.monotonic()
    thread.start()
    while thread.is_alive():
        thread.join(_POLL_S)
        check_stop()  # the loader thread is abandoned; the process ends soon after
        if time.monotonic() - next_line >= PROGRESS_S:
            next_line = time.monotonic()
            log.info("loading %s: %.0f s so far", setting, next_line - began)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]
