"""One home per number: ``results/numbers.md`` is what ``scripts/results_numbers.py`` writes
from the committed files, and the pages of ``docs/`` and the README quote its labels.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
#: a label of results/numbers.md quoted in a page: `file.row.quantity` (``<row>`` for any row)
LABEL = re.compile(r"`((?:epoch_[12]t|rss|conv|vrgd|sweep|per_sample|orderings|projection)"
                   r"(?:\.[^.`\s]+){2,})`")  # fmt: skip
#: a measured time, ratio or size written out in prose (what only numbers.md may hold)
MEASURED = re.compile(r"\b\d+\.\d+ ?(?:ms\b|s\b|x\b|\u00d7|MiB|GiB)")


def _script():
    spec = importlib.util.spec_from_file_location("results_numbers", ROOT / "scripts" /
                                                  "results_numbers.py")  # fmt: skip
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _labels() -> set[str]:
    text = (ROOT / "results" / "numbers.md").read_text()
    return {line.split(" = ", 1)[0] for line in text.splitlines() if " = " in line}


def test_numbers_md_is_what_the_script_writes(monkeypatch):
    """Regenerate it after a bench sitting or a new run: ``python scripts/results_numbers.py``."""
    monkeypatch.chdir(ROOT)
    script = _script()
    assert (ROOT / "results" / "numbers.md").read_text() == script.render(Path("results/bench"))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_quoted_label_is_in_numbers_md(page):
    labels = _labels()
    quoted = LABEL.findall(page.read_text())
    missing = []
    for label in quoted:
        pattern = re.compile("^" + re.escape(label).replace(re.escape("<row>"), "[^.]+") + "$")
        if not any(pattern.match(known) for known in labels):
            missing.append(label)
    assert not missing, f"{page.name} quotes labels results/numbers.md does not have: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_pages_write_no_measured_number_by_hand(page):
    """Times, ratios and sizes come from results/numbers.md, quoted by label."""
    written = [m.group(0) for m in MEASURED.finditer(page.read_text())]
    assert not written, f"{page.name} writes measured numbers by hand: {written}"
