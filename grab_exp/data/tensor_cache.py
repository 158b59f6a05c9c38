"""A directory of tensor files keyed by the sha256 of the data source they were built from."""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import torch

_HASH_BLOCK = 1 << 20


def file_sha256(path: Path) -> str:
    """Return the hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        while block := stream.read(_HASH_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def folder_sha256(folder: Path) -> str:
    """Return a sha256 over the relative paths and contents of every file below ``folder``."""
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(path.relative_to(folder).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def source_sha256(source: Path) -> str:
    """Return the sha256 of an archive file, or of a folder's files (see :func:`folder_sha256`)."""
    return folder_sha256(source) if source.is_dir() else file_sha256(source)


def cache_file(cache_dir: Path, prefix: str, digest: str) -> Path:
    """Return ``<cache_dir>/<prefix>-<first 16 hex digits of digest>.pt``."""
    return cache_dir / f"{prefix}-{digest[:16]}.pt"


def save_atomically(payload: dict[str, Any], path: Path) -> None:
    """Write ``payload`` with ``torch.save`` to a temporary file, then rename it onto ``path``.

    Readers never see a partial file; concurrent writers of the same content are harmless.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(payload, stream)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def load_tensors(path: Path) -> dict[str, Any]:
    """Load a file written by :func:`save_atomically` (``weights_only=True``)."""
    return torch.load(path, map_location="cpu", weights_only=True)
