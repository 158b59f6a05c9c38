"""One-line, setting-naming errors for bad configuration values."""

from __future__ import annotations

from collections.abc import Callable, Iterable


def check_choice(setting: str, value: object, allowed: Iterable[str]) -> None:
    """Raise unless ``value`` is one of ``allowed``.

    Raises:
        ValueError: ``"<setting>: got <value>; allowed: a, b, c"``.
    """
    options = sorted(allowed)
    if value not in options:
        raise ValueError(f"{setting}: got {value!r}; allowed: {', '.join(options)}")


def check_number(
    setting: str,
    value: object,
    ok: Callable[[float], bool],
    allowed: str,
    kind: type | tuple[type, ...] = (int, float),
) -> None:
    """Raise unless ``value`` is a ``kind`` (never a bool) for which ``ok(value)`` holds.

    Args:
        setting: the setting's name in the message (``optimizer.lr``).
        value: the value given.
        ok: the rule a number of ``kind`` must pass (``lambda v: v > 0``).
        allowed: the rule in words (``a number > 0``).
        kind: the types accepted: ``int`` for an integer setting.

    Raises:
        ValueError: ``"<setting>: got <value>; allowed: <allowed>"``.
    """
    if isinstance(value, bool) or not isinstance(value, kind) or not ok(value):
        raise ValueError(f"{setting}: got {value!r}; allowed: {allowed}")


def check_positive(setting: str, value: float) -> None:
    """Raise unless ``value`` is a number > 0."""
    check_number(setting, value, lambda v: v > 0, "a number > 0")


def check_non_negative(setting: str, value: float) -> None:
    """Raise unless ``value`` is a number >= 0."""
    check_number(setting, value, lambda v: v >= 0, "a number >= 0")


def check_below_one(setting: str, value: float) -> None:
    """Raise unless ``value`` is a number in ``[0, 1)``."""
    check_number(setting, value, lambda v: 0 <= v < 1, "a number in [0, 1)")


def check_int_at_least(setting: str, value: int, minimum: int) -> None:
    """Raise unless ``value`` is an integer >= ``minimum``."""
    check_number(setting, value, lambda v: v >= minimum, f"an integer >= {minimum}", int)


def check_power_of_two(setting: str, value: int) -> None:
    """Raise unless ``value`` is a positive power of two (1, 2, 4, ...)."""
    allowed = "a power of two (1, 2, 4, 8, ...)"
    check_number(setting, value, lambda v: v >= 1 and not v & (v - 1), allowed, int)
