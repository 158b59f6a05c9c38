"""One-line, setting-naming errors for bad configuration values."""

from __future__ import annotations

from collections.abc import Iterable


def check_choice(setting: str, value: object, allowed: Iterable[str]) -> None:
    """Raise unless ``value`` is one of ``allowed``.

    Raises:
        ValueError: ``"<setting>: got <value>; allowed: a, b, c"``.
    """
    options = sorted(allowed)
    if value not in options:
        raise ValueError(f"{setting}: got {value!r}; allowed: {', '.join(options)}")


def check_positive(setting: str, value: float) -> None:
    """Raise unless ``value`` is a number > 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{setting}: got {value!r}; allowed: a number > 0")


def check_int_at_least(setting: str, value: int, minimum: int) -> None:
    """Raise unless ``value`` is an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{setting}: got {value!r}; allowed: an integer >= {minimum}")


def check_power_of_two(setting: str, value: int) -> None:
    """Raise unless ``value`` is a positive power of two (1, 2, 4, ...)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value & (value - 1):
        raise ValueError(f"{setting}: got {value!r}; allowed: a power of two (1, 2, 4, 8, ...)")
