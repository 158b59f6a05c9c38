"""Checkpoints: everything needed to continue a run exactly, written atomically."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from grab_exp.logging.files import atomic_torch_save

CHECKPOINT_NAME = "checkpoint.pt"


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
    atomic_torch_save({**state, "rng": rng_states()}, run_dir / CHECKPOINT_NAME)


def load_checkpoint(run_dir: Path) -> dict[str, Any] | None:
    """The last checkpoint (``weights_only=True``), or ``None`` when there is none."""
    path = run_dir / CHECKPOINT_NAME
    if not path.exists():
        return None
    state = torch.load(path, map_location="cpu", weights_only=True)
    restore_rng_states(state["rng"])
    return state
