"""Checkpoints: everything needed to continue a run exactly, written atomically."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from grab_exp.logging.files import atomic_torch_save, damaged
from grab_exp.logging.local import REMEDY

CHECKPOINT_NAME = "checkpoint.pt"
#: 2: every job writes ``strategy``, ``world_size`` and ``ordering``; 1 (no ``format`` key): a
#: single-process job wrote its sampler's state as ``sampler``, a data-parallel one had no kind
FORMAT = 2


def rng_states() -> dict[str, Any]:
    """The global torch RNG states (CPU and every CUDA device)."""
    states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def restore_rng_states(states: dict[str, Any]) -> None:
    """Undo ``rng_states()``."""
    torch.set_rng_state(states["torch"])
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def save_checkpoint(run_dir: Path, **state: Any) -> None:
    """Write ``checkpoint.pt`` atomically (temp file + rename): a kill never leaves half."""
    atomic_torch_save({"format": FORMAT, **state, "rng": rng_states()}, run_dir / CHECKPOINT_NAME)


def upgrade(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint of an earlier format in today's layout (format 1 -> 2)."""
    if state.get("format", 1) >= FORMAT:
        return state
    if "sampler" in state:  # a single-process job
        state["ordering"] = state.pop("sampler")
        state.update(strategy="single", world_size=1)
    else:
        state["strategy"] = "data_parallel"
    state["format"] = FORMAT
    return state


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    """The last checkpoint (``weights_only=True``), or ``None`` when there is none.

    Raises:
        DamagedFileError: the file is truncated, not a checkpoint, or holds objects that
            ``weights_only`` refuses (code could run); the message names the file.
    """
    path = run_dir / CHECKPOINT_NAME
    if not path.exists():
        return None
    try:
        state = upgrade(torch.load(path, map_location="cpu", weights_only=True))
        restore_rng_states(state["rng"])
        _ = state["epoch"]  # every checkpoint has it
    except Exception as error:  # torch raises many kinds; none of its advice is ours to give
        raise damaged(path, _problem(error), REMEDY) from None
    return state


def _problem(error: Exception) -> str:
    """What is wrong with a checkpoint file, without torch's advice (``weights_only=False``
    would run whatever code the file holds)."""
    if isinstance(error, pickle.UnpicklingError):
        return "not a checkpoint of this program: a weights-only load refused its content"
    if isinstance(error, (KeyError, TypeError, AttributeError, IndexError)):
        return "not a checkpoint of this program: an entry is missing or of the wrong type"
    return "truncated or not a checkpoint"
