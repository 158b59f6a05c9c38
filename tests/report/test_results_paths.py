"""Nothing committed under ``results/`` names a folder of the machine that made it."""

from __future__ import annotations

import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[2] / "results"
# an absolute path into a home, temporary or work folder (POSIX, macOS, Windows)
ABSOLUTE = re.compile(
    r"(?<![\w.~-])(/(home|tmp|root|work|Users|var/folders|private/tmp|mnt|scratch)/"
    r"|[A-Za-z]:\\\\(Users|Temp)\\\\)"
)
TEXT_SUFFIXES = {".csv", ".md", ".tex", ".json", ".yaml", ".yml", ".txt", ".log"}


def test_no_file_under_results_holds_an_absolute_machine_path():
    files = [p for p in RESULTS.rglob("*") if p.is_file() and p.suffix in TEXT_SUFFIXES]
    assert len(files) > 100  # the runs' own files are scanned too
    offenders = {}
    for path in files:
        found = ABSOLUTE.search(path.read_text(encoding="utf-8", errors="replace"))
        if found:
            offenders[str(path.relative_to(RESULTS))] = found[0]
    assert not offenders, offenders


def test_the_pattern_finds_the_paths_it_is_meant_to():
    for text in ("cwd: /work/main", "run,/home/me/x", "dir: /tmp/pytest-1/a", r"C:\\Users\\me"):
        assert ABSOLUTE.search(text), text
    for text in ("outputs/table1/rr/seed0", "results/table1/runs", "2/tmp", "conf"):
        assert not ABSOLUTE.search(text), text
