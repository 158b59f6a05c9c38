"""Helpers of ``scripts/gpu_rehearse.sh`` and ``scripts/gpu_check.sh`` (standard library only,
but for ``link``).

``python scripts/gpu_rehearsal.py link FOLDER DIST...``: links into ``FOLDER`` the installed
distributions ``DIST...`` of this interpreter and everything they require (markers evaluated,
no extras), so that a venv with ``FOLDER`` on its path sees these and nothing else.

``python scripts/gpu_rehearsal.py limits OUTPUT_DIR``: exit 1 unless ``OUTPUT_DIR`` fits what the
device tool brings back (at most 8 files, 16 MiB each, 64 MiB together, no more than 2 folders
down, names of letters, digits, ``.``, ``_`` and ``-``); prints the files.

``python scripts/gpu_rehearsal.py with-sigint COMMAND...``: runs ``COMMAND`` (``exec``) with
SIGINT at its default action, whatever this process inherited: a child of a shell that runs
it in the background would otherwise ignore ``timeout --signal=INT``.

``python scripts/gpu_rehearsal.py compile-limit PROBE_JSONL``: prints the compile tests' time
limit in seconds: 4 cold compiles per xdist worker (6 tests on 4 workers, 2 graphs each) of the
probe's cold compile on CUDA, x 1.5, + 20; 150 when the file has none.
"""

from __future__ import annotations

import json
import math
import re
import sys
from importlib import metadata
from pathlib import Path

MAX_FILES, MAX_FILE_BYTES, MAX_TOTAL_BYTES, MAX_FOLDERS_DOWN = 8, 16 * 2**20, 64 * 2**20, 2
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def closure(names: list[str]) -> dict[str, metadata.Distribution]:
    """The distributions ``names`` and, recursively, the ones they require."""
    from packaging.requirements import Requirement  # not on the GPU machine: only link uses it
    from packaging.utils import canonicalize_name

    found: dict[str, metadata.Distribution] = {}
    waiting = [canonicalize_name(n) for n in names]
    while waiting:
        name = waiting.pop()
        if name in found:
            continue
        dist = found[name] = metadata.distribution(name)
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                waiting.append(canonicalize_name(requirement.name))
    return found


def top_level_entries(dist: metadata.Distribution) -> set[str]:
    """The names at the top of site-packages that ``dist`` installed (its dist-info too)."""
    entries = {Path(str(f)).parts[0] for f in dist.files or []}
    return {e for e in entries if e not in ("..", "__pycache__") and not e.endswith(".pth")}


def link(folder: str, *names: str) -> None:
    target = Path(folder)
    target.mkdir(parents=True, exist_ok=True)
    for dist in closure(list(names)).values():
        site = Path(dist.locate_file(""))
        for entry in top_level_entries(dist):
            if (site / entry).exists() and not (target / entry).exists():
                (target / entry).symlink_to(site / entry)


def limits(folder: str) -> None:
    root = Path(folder)
    files = sorted(p for p in root.rglob("*") if p.is_file() or p.is_symlink())
    problems = [f"{len(files)} files (at most {MAX_FILES})"] if len(files) > MAX_FILES else []
    total = 0
    for path in files:
        relative, size = path.relative_to(root), path.lstat().st_size
        total += size
        print(f"{size:>10} {relative}")
        if size > MAX_FILE_BYTES:
            problems.append(f"{relative}: {size} bytes (at most {MAX_FILE_BYTES})")
        if len(relative.parts) - 1 > MAX_FOLDERS_DOWN:
            problems.append(f"{relative}: over {MAX_FOLDERS_DOWN} folders down")
        if path.is_symlink() or not all(NAME.match(part) for part in relative.parts):
            problems.append(f"{relative}: a link or a name outside [A-Za-z0-9._-]")
    if total > MAX_TOTAL_BYTES:
        problems.append(f"{total} bytes together (at most {MAX_TOTAL_BYTES})")
    for problem in problems:
        print(f"error: OUTPUT_DIR: {problem}", file=sys.stderr)
    if problems:
        sys.exit(1)


def with_sigint(*command: str) -> None:
    import os
    import signal

    signal.signal(signal.SIGINT, signal.SIG_DFL)  # an ignored signal stays ignored across exec
    os.execvp(command[0], list(command))


COMPILES_PER_WORKER, MARGIN, START_S, DEFAULT_COMPILE_LIMIT_S = 4, 1.5, 20, 150


def compile_limit(probe: str) -> None:
    path = Path(probe)
    lines = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
    cold = [
        line["cold_compile_s"]
        for line in lines
        if line.get("probe") == "compile" and line.get("ok") and line.get("model") == "LeNet"
    ]
    if not cold:
        print(DEFAULT_COMPILE_LIMIT_S)
        return
    print(math.ceil(COMPILES_PER_WORKER * cold[-1] * MARGIN + START_S))


if __name__ == "__main__":
    commands = {
        "link": link,
        "limits": limits,
        "compile-limit": compile_limit,
        "with-sigint": with_sigint,
    }
    commands[sys.argv[1]](*sys.argv[2:])
