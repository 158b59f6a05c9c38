"""Named regression cases: the minimal models of the failure classes the fuzzer found, as
:class:`~fuzz.case.Case` objects run by the same oracle (``test_regression[<name>]``)."""

from __future__ import annotations

from collections.abc import Callable

from .case import Case

REGRESSIONS: dict[str, Callable[[], Case]] = {}
