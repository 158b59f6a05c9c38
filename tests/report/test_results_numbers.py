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
#: unitless measured numbers written out in prose (outside code and quotes): counts of operators
#: or kernels (and what a stage dispatches), percentages, ranges, decimals of two or more places,
#: "k of n" counts, durations
UNITLESS = {
    "count": re.compile(r"(?<![\w.])\d[\d,]*\s+(?:\w+\s+)?(?:operators?|kernels?)\b"),
    "dispatched": re.compile(r"\bdispatch(?:es|ed)?\s+\d+(?![\w.])"),
    "percentage": re.compile(r"(?<![\w.])[+\-\u2212]?\d+(?:\.\d+)?\s?%"),
    "range": re.compile(r"(?<![\w.\-])\d+(?:\.\d+)?[-\u2013]\d+(?:\.\d+)?(?![\w.\-])"),
    "decimal": re.compile(r"(?<![\w.])[+\-\u2212]?\d+\.\d{2,}(?![\w.])"),
    "k of n": re.compile(r"(?<![\w.])\d+ of \d+(?![\w.])"),
    "duration": re.compile(r"(?<![\w.])\d[\d,.]*\s?(?:minutes?|hours?)\b"),
}
#: code (fenced blocks and spans: commands, options, labels), which UNITLESS does not read
CODE = re.compile(r"^```.*?^```|`[^`\n]*`", re.S | re.M)
#: what UNITLESS finds in a page and may stay, because it is not read from a committed result
ALLOWED = {
    "README.md": {
        "8969\u20138981",  # the paper's pages
    },
    "docs/experiments.md": {
        "0.001", "0.01",  # conf/: lr, weight decay
    },
    "docs/troubleshooting.md": {"0.001", "0.05"},  # an example error message's config values
    "docs/which-models-work.md": {"0.72"},  # an example error message
    "results/README.md": {
        "0.001", "0.01",  # conf/: lr, weight decay
        "1-100", "91-100", "2-10",  # epoch ranges
        "25%", "45%",  # the VRGD report's accuracy targets
        "95%",  # the level of the paired tests' intervals
        "0.05",  # the significance level the Holm-adjusted p are read against
    },
    "results/bench/README.md": {
        "0.001", "0.01",  # conf/: lr, weight decay
        "0-4",  # tree levels
        "95%",  # LeNet's Linear layers' share of its weights (the model, not a result)
        "3.97",  # the (16, 62,006) float32 buffer in MB
        "0.74",  # CIFAR-10 as float32 in GB
        "1.00",  # classic RR's ratio to itself
        # the sitting before (its files only in git, at 2df3396: --bench prints them)
        "0.00", "0.04", "0.11", "2.90", "1.32", "1.38", "1.79", "1.41",
    },
    "results/distributed/README.md": {"0.01", "0.001"},  # the command's lr, conf's weight decay
    "results/vrgd/README.md": {
        "0.02", "0.001", "0.999", "0.08",  # conf/: learning rates, Adam's beta
        "25%", "45%",  # the report's accuracy targets
    },
}  # fmt: skip


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


def _unitless(text: str) -> list[str]:
    """The unitless numbers ``text`` writes by hand: UNITLESS outside quotes and code."""
    prose = CODE.sub("", _script().QUOTE.sub("", text))
    return [m.group(0) for pattern in UNITLESS.values() for m in pattern.finditer(prose)]


@pytest.mark.parametrize("page", QUOTING, ids=lambda p: str(p.relative_to(ROOT)))
def test_pages_write_no_unitless_measured_number_by_hand(page):
    """Counts, percentages, ranges and decimals read from the committed files come from
    results/numbers.md too; ALLOWED names the few that are not results."""
    allowed = ALLOWED.get(str(page.relative_to(ROOT)), set())
    written = [n for n in _unitless(page.read_text()) if n not in allowed]
    assert not written, f"{page.name} writes measured numbers by hand: {written}"


def test_the_allowlist_names_only_what_the_pages_write():
    pages = {str(page.relative_to(ROOT)): page for page in QUOTING}
    for name, allowed in ALLOWED.items():
        stale = allowed - set(_unitless(pages[name].read_text()))
        assert not stale, f"{name} no longer writes {sorted(stale)}: drop them from ALLOWED"


@pytest.mark.parametrize(
    "text",
    [
        "a classic step dispatches 84 operators",
        "the gradient stage dispatches 58 (61 on the hook path)",
        "the graph holds 551 kernels",
        "one fewer in the VRGD rows (181-302)",
        "clipped 23\u201342% of its elements",
        "the smallest p is 0.118 here",
        "in all 15 of 15 comparisons",
        "the sweep took 78 minutes",
    ],
)
def test_a_hand_written_count_is_caught(text, tmp_path):
    page = tmp_path / "README.md"
    page.write_text(text + "\n")
    assert _unitless(page.read_text()), text


def test_a_quoted_count_or_code_is_not_caught():
    text = (
        "dispatches <!--n:epoch_1t.rr-classic.operators-->84<!--/n--> operators "
        "(`--repeats 30`, `epochs 1-100`)\n```bash\nrun --n 50,000 --p 0.118\n```\n"
    )
    assert _unitless(text) == []


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
