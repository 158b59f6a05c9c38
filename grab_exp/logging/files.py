"""Crash-safe file writes: a reader sees the old file or the new one, never a partial one.

Every write goes to a temporary file in the target's own directory (so the final rename never
crosses a file system), is flushed and fsynced, and then replaces the target with
:func:`os.replace`, which is atomic on POSIX and Windows. The directory is fsynced afterwards
(where the platform allows it) so that the rename itself survives a power loss.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

TMP_SUFFIX = ".tmp"


class DamagedFileError(ValueError):
    """A run file that cannot be read; the message names it, what is wrong and what to do."""


class WriteError(OSError):
    """A run file could not be written: ``could not write <path>: <errno text>``."""


def _os_error_in(error: BaseException) -> OSError | None:
    """The first ``OSError`` with an errno in ``error``'s chain (torch wraps a failed write
    in ``RuntimeError``s), or ``None``."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno is not None:
            return error
        error = error.__cause__ or error.__context__
    return None


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn a failed write to ``path`` (disk full, quota, permissions) into one
    :class:`WriteError` line that names the file and the errno's text."""
    try:
        yield
    except WriteError:
        raise
    except (OSError, RuntimeError) as error:
        cause = _os_error_in(error)
        if cause is None:
            raise
        failure = WriteError(f"could not write {path}: {os.strerror(cause.errno)}")
        failure.errno = cause.errno
        raise failure from None


def umask_mode(mode: int = 0o666) -> int:
    """``mode`` less the process's umask: the mode a plain ``open`` would create a file with."""
    mask = os.umask(0)
    os.umask(mask)
    return mode & ~mask


def damaged(path: str | os.PathLike[str], problem: str, remedy: str) -> DamagedFileError:
    """The one message style of a damaged file: ``<path> is damaged (<problem>); <remedy>``."""
    return DamagedFileError(f"{path} is damaged ({problem}); {remedy}")


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Atomically replace ``path`` with ``text`` (UTF-8).

    Args:
        path: Target file; its parent directory must exist.
        text: The complete new content.
    """
    with _atomic_target(path, binary=False) as handle:
        handle.write(text)


def atomic_torch_save(obj: Any, path: str | os.PathLike[str]) -> None:
    """Atomically replace ``path`` with ``torch.save(obj)``.

    Args:
        obj: Anything :func:`torch.save` accepts (a checkpoint dict).
        path: Target file; its parent directory must exist.
    """
    import torch  # local import: the rest of this module must stay cheap to import

    with _atomic_target(path, binary=True) as handle:
        torch.save(obj, handle)


def write_json(path: str | os.PathLike[str], obj: Any) -> None:
    """Atomically write ``obj`` as indented, strict JSON.

    JSON has no NaN or infinity: non-finite floats are written as ``null``. Tensors and NumPy
    scalars are converted with ``.item()``/``.tolist()``; other unknown objects with ``str``.
    """
    text = json.dumps(_finite(obj), indent=2, allow_nan=False, default=_to_builtin)
    atomic_write_text(path, text + "\n")


def read_json(path: str | os.PathLike[str], remedy: str = "delete it") -> Any | None:
    """Return the parsed JSON content of ``path``, or ``None`` when the file does not exist.

    Raises:
        DamagedFileError: the file is not UTF-8 JSON (the message names it and ``remedy``).
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError:
        raise damaged(path, "not UTF-8 text", remedy) from None
    try:
        return json.loads(text)
    except ValueError as error:
        raise damaged(path, f"not valid JSON: {error}", remedy) from None


@contextlib.contextmanager
def _atomic_target(path: str | os.PathLike[str], *, binary: bool) -> Iterator[IO[Any]]:
    """Yield a temporary file next to ``path``; on success make it ``path``, else delete it."""
    target = Path(path)
    with writing(target):
        fd, tmp_name = tempfile.mkstemp(
            prefix=f".{target.name}.", suffix=TMP_SUFFIX, dir=target.parent
        )
        try:
            os.fchmod(fd, umask_mode())  # mkstemp's file is private (0600); others' are not
            mode = "wb" if binary else "w"
            encoding = None if binary else "utf-8"
            with os.fdopen(fd, mode, encoding=encoding, newline=None if binary else "") as handle:
                yield handle
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp_name, target)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp_name)
            raise
        fsync_dir(target.parent)


def remove_stale_temp_files(directory: str | os.PathLike[str]) -> list[Path]:
    """Delete the temp files a killed atomic write left in ``directory``; return them.

    Only ``.<name>.<random>.tmp`` files of this module's writers are touched.
    """
    stale = sorted(Path(directory).glob(f".*{TMP_SUFFIX}"))
    for path in stale:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    return stale


def fsync_dir(directory: str | os.PathLike[str]) -> None:
    """Fsync ``directory`` so a rename or new file in it is durable (no-op off POSIX)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _finite(obj: Any) -> Any:
    """Recursively replace non-finite floats by ``None`` (JSON has no NaN)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {key: _finite(value) for key, value in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(value) for value in obj]
    return obj


def _to_builtin(obj: Any) -> Any:
    """``json.dumps`` fallback: tensors/NumPy values via ``tolist``/``item``, else ``str``."""
    for method in ("tolist", "item"):
        convert = getattr(obj, method, None)
        if callable(convert):
            with contextlib.suppress(Exception):
                return _finite(convert())
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    return str(obj)


def shown(path: str | os.PathLike[str]) -> str:
    """``path`` as a user types it: relative to the working directory when inside it."""
    path = Path(path).resolve()
    cwd = Path.cwd().resolve()
    return str(path.relative_to(cwd)) if path.is_relative_to(cwd) else str(path)


def without_run_cwd(hydra_yaml: str) -> str:
    """A job's ``hydra.yaml`` text with its working directory (``runtime.cwd``) made relative.

    Paths under the directory the job ran in lose that prefix and the directory itself becomes
    ``.``, so an archived config names no folder of the machine that made it.
    """
    match = re.search(r"^\s+cwd: (/\S*)$", hydra_yaml, flags=re.M)
    if match is None:
        return hydra_yaml
    cwd = match[1].rstrip("/")
    return re.sub(
        rf"{re.escape(cwd)}(/|(?=[\s'\"]|$))", lambda m: "" if m[1] else ".", hydra_yaml, flags=re.M
    )
