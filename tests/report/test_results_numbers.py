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
#: the pages that quote every measured number: the README, ``docs/`` and all of results/**/README.md
QUOTING = [*PAGES, *sorted((ROOT / "results").glob("**/README.md"))]
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


def _values() -> dict[str, str]:
    return _script().labelled((ROOT / "results" / "numbers.md").read_text())


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


@pytest.mark.parametrize("page", QUOTING, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_write_no_measured_number_by_hand(page):
    """Times, ratios and sizes come from results/numbers.md, quoted by label or as
    ``<!--n:label-->value<!--/n-->``."""
    text = _script().QUOTE.sub("", page.read_text())
    written = [m.group(0) for m in MEASURED.finditer(text)]
    assert not written, f"{page.name} writes measured numbers by hand: {written}"


def test_every_quoted_number_is_current(monkeypatch):
    """A page's ``<!--n:label-->value<!--/n-->`` holds numbers.md's value of ``label``."""
    monkeypatch.chdir(ROOT)
    script = _script()
    values = _values()
    for page in script.quoting_pages():
        assert page.read_text() == script.quote(page, values), (
            f"{page.name} quotes a stale number: run python scripts/results_numbers.py"
        )


def test_a_stale_quote_is_rewritten_and_fails_the_check(tmp_path, monkeypatch):
    script = _script()
    label, value = next(iter(_values().items()))
    (tmp_path / "results" / "bench").mkdir(parents=True)
    page = tmp_path / "results" / "bench" / "README.md"
    page.write_text(f"the step took <!--n:{label}-->not {value}<!--/n--> here\n")
    assert script.quote(page, _values()) == f"the step took <!--n:{label}-->{value}<!--/n--> here\n"
    monkeypatch.setattr(script, "render", lambda folder: "numbers\n")
    monkeypatch.setattr(script, "labelled", lambda text: _values())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "numbers.md").write_text("numbers\n")
    assert script.main(["--check", "--out", "numbers.md"]) == 1
    assert script.main(["--out", "numbers.md"]) == 0
    assert page.read_text() == f"the step took <!--n:{label}-->{value}<!--/n--> here\n"
    assert script.main(["--check", "--out", "numbers.md"]) == 0


def test_a_quote_of_an_unknown_label_is_refused(tmp_path):
    page = tmp_path / "README.md"
    page.write_text("<!--n:epoch_1t.no_such_row.ratio-->1.00<!--/n-->\n")
    with pytest.raises(ValueError, match=r"epoch_1t\.no_such_row\.ratio"):
        _script().quote(page, _values())
