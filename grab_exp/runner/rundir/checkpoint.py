"""Checkpoints: everything needed to continue a run exactly, written atomically."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import torch

from grab_exp.logging.files import atomic_torch_save, damaged
from grab_exp.logging.local import REMEDY

CHECKPOINT_NAME = "checkpoint.pt"
#: 3: also ``device_type`` (``cpu`` | ``cuda``: where the job's generators ran); 2: every job
#: writes ``strategy``, ``world_size`` and ``ordering``; 1 (no ``format`` key): a single-process
#: job wrote its sampler's state as ``sampler``, a data-parallel one had no kind
FORMAT = 3
CPU_GENERATOR_STATE_BYTES = torch.Generator().get_state().numel()  # 5056; a CUDA one has 16


def rng_states() -> dict[str, Any]:
    """The global torch RNG states (CPU and every CUDA device), as CPU byte tensors."""
    states: dict[str, Any] = {"torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        states["cuda"] = [state.cpu() for state in torch.cuda.get_rng_state_all()]
    return states


def cuda_states_to_restore(saved: list[torch.Tensor], present: int) -> list[torch.Tensor]:
    """The saved per-GPU states that have a GPU here: device ``i`` takes ``saved[i]``.

    A checkpoint written where more GPUs were visible keeps only the first ``present``; with
    fewer saved than present, the extra GPUs keep their current state.
    """
    return list(saved[:present])


def restore_rng_states(states: dict[str, Any]) -> None:
    """Undo ``rng_states()``, whatever the number of GPUs visible now."""
    torch.set_rng_state(states["torch"].cpu())
    if torch.cuda.is_available():
        saved = cuda_states_to_restore(states.get("cuda", []), torch.cuda.device_count())
        for index, state in enumerate(saved):
            torch.cuda.set_rng_state(state.cpu(), index)


def _generator_device_type(state: torch.Tensor) -> str:
    """``cpu`` or ``cuda``: the kind of generator whose ``get_state()`` is ``state``."""
    return "cpu" if state.numel() == CPU_GENERATOR_STATE_BYTES else "cuda"


def _add_device_types(ordering: Any, found: list[str]) -> None:
    """Format 2 -> 3 in an ordering's (nested) state: every dict with a ``generator`` state
    gets its ``generator_device``, and its projection description a ``device_type``."""
    if isinstance(ordering, (list, tuple)):
        for item in ordering:
            _add_device_types(item, found)
    if not isinstance(ordering, dict):
        return
    if isinstance(ordering.get("generator"), torch.Tensor):
        device_type = _generator_device_type(ordering["generator"])
        ordering.setdefault("generator_device", device_type)
        if isinstance(ordering.get("projection"), dict):
            ordering["projection"].setdefault("device_type", device_type)
        found.append(device_type)
    for value in ordering.values():
        if isinstance(value, (list, tuple, dict)):
            _add_device_types(value, found)


def save_checkpoint(run_dir: Path, **state: Any) -> None:
    """Write ``checkpoint.pt`` atomically (temp file + rename): a kill never leaves half."""
    atomic_torch_save({"format": FORMAT, **state, "rng": rng_states()}, run_dir / CHECKPOINT_NAME)


def upgrade(state: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint of an earlier format in today's layout (format 1 -> 2 -> 3).

    Format 3's device types are read off the orderings' generator states (a CPU generator's
    state is 5056 bytes, a CUDA one's 16); a job whose ordering holds no generator is taken
    to have run on ``cpu``.
    """
    if state.get("format", 1) >= FORMAT:
        return state
    if state.get("format", 1) < 2:
        if "sampler" in state:  # a single-process job
            state["ordering"] = state.pop("sampler")
            state.update(strategy="single", world_size=1)
        else:
            state["strategy"] = "data_parallel"
    found: list[str] = []
    _add_device_types(state.get("ordering"), found)
    state["device_type"] = found[0] if found else "cpu"
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


def logger_ids(state: dict[str, Any]) -> dict[str, str | None]:
    """Each logger's run id kept in a checkpoint (one written before ``logger_ids`` existed
    kept W&B's alone, as ``wandb_id``)."""
    if "logger_ids" in state:
        return dict(state["logger_ids"])
    return {"wandb": state.get("wandb_id")}


def kept_logger_ids(run_dir: Path) -> dict[str, str | None]:
    """The logger ids in ``run_dir``'s checkpoint (``{}`` without a readable one), read
    without restoring anything (:func:`load_checkpoint` also sets the RNG states)."""
    try:
        state = torch.load(run_dir / CHECKPOINT_NAME, map_location="cpu", weights_only=True)
    except Exception:  # absent or damaged: no ids to tell
        return {}
    return logger_ids(state) if isinstance(state, dict) else {}


def merged_logger_ids(
    kept: dict[str, str | None], started: dict[str, str | None]
) -> dict[str, str | None]:
    """Every logger id the run has had: ``kept`` (the checkpoint's), updated by the ids this
    attempt's loggers returned (``None`` where one gave none); a logger absent now, or that
    returned ``None`` after an earlier attempt's id, keeps that id, so a later attempt with it
    continues the same run."""
    merged = dict(kept)
    for name, run_id in started.items():
        if run_id is not None or merged.get(name) is None:
            merged[name] = run_id
    return merged


def _problem(error: Exception) -> str:
    """What is wrong with a checkpoint file, without torch's advice (``weights_only=False``
    would run whatever code the file holds)."""
    if isinstance(error, pickle.UnpicklingError):
        return "not a checkpoint of this program: a weights-only load refused its content"
    if isinstance(error, (KeyError, TypeError, AttributeError, IndexError)):
        return "not a checkpoint of this program: an entry is missing or of the wrong type"
    return "truncated or not a checkpoint"
