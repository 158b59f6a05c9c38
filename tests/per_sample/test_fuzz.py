"""The seeded differential fuzzer of ``make_per_sample`` (issue 49, item 11): generated models,
losses, inputs and batch schedules, each case ONE ``psg`` over several batches against a float64
per-example loop (rows) and a plain ``loss.backward()`` (``p.grad``); see :mod:`fuzz`.

Every case must end ``right`` or ``refused`` (a one-line refusal that the case allows: a feature
refused by design, :data:`fuzz.oracle.BY_DESIGN`, or the hook path asked for by name); a
``wrong`` result, a ``crash`` (a raw or multi-line exception), a ``false_refusal`` (a refusal of a
case that must be right) and an ``invalid`` case fail. The summary table of outcome classes is
printed at the end of the module.

Sizes: ``GRAB_FUZZ_CASES`` cases (default 250, about 2 minutes) from seed ``GRAB_FUZZ_START``
(default 0); thousands: ``GRAB_FUZZ_CASES=2000 python -m pytest tests/per_sample/test_fuzz.py``,
or without pytest, with failure classes, feature rates and shrinking:
``PYTHONPATH=tests/per_sample python -m fuzz.run --cases 2000 --shrink``.

One case, by its seed: ``python -m pytest "tests/per_sample/test_fuzz.py::test_fuzz_case[seed17]"``
(or ``PYTHONPATH=tests/per_sample python -m fuzz.run --seed 17``). The named regression cases
(:mod:`fuzz.regressions`) run in the same harness: ``test_regression[<name>]``.
"""

from __future__ import annotations

import os

import pytest
from fuzz.case import Case, draw_case
from fuzz.oracle import PASSING, Outcome, run_case
from fuzz.regressions import REGRESSIONS
from fuzz.report import failure_classes, table

CASES = int(os.environ.get("GRAB_FUZZ_CASES", "250"))
START = int(os.environ.get("GRAB_FUZZ_START", "0"))
RESULTS: list[tuple[Case, Outcome]] = []


@pytest.fixture(scope="module", autouse=True)
def _summary(request):
    """Print the outcome table and the failure classes after the module's cases."""
    yield
    plugins = request.config.pluginmanager
    reporter, capture = plugins.get_plugin("terminalreporter"), plugins.get_plugin("capturemanager")
    if reporter is None or capture is None or not RESULTS:
        return
    with capture.global_and_fixture_disabled():  # shown without -s
        reporter.write_line(f"\nfuzz: {len(RESULTS)} cases\n{table(RESULTS)}")
        reporter.write_line(failure_classes(RESULTS))


def check(case: Case, name: str) -> None:
    outcome = run_case(case)
    RESULTS.append((case, outcome))
    assert outcome.kind in PASSING, (
        f"{name} [{case.family}, method={case.method}]: {outcome.kind} at call {outcome.call}: "
        f"{outcome.detail}; features: {' '.join(case.features)}"
    )


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(START, START + CASES), ids=lambda s: f"seed{s}")
def test_fuzz_case(seed: int) -> None:
    check(draw_case(seed), f"seed {seed}")


@pytest.mark.parametrize("name", list(REGRESSIONS))
def test_regression(name: str) -> None:
    check(REGRESSIONS[name](), name)
