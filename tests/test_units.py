"""Durations and sizes read one way wherever they are shown: each formatter is named after
the unit it takes (console/core/units.py), and keeps the text its callers always printed."""

from __future__ import annotations

import pytest

from console.core import units


@pytest.mark.parametrize(
    ("seconds", "kwargs", "shown"),
    [
        (0.012, {}, "12 ms"),
        (0.0125, {}, "12 ms"),  # half to even, as the copies rounded
        (0.0004, {}, "0 ms"),
        (1.5, {}, "1500 ms"),  # never switches to seconds: a bound reads in one unit
        (None, {}, "?"),  # unknown is unknown, never 0
        (None, {"unknown": ""}, ""),  # a drill report's empty cell
        (0.075, {"sep": ""}, "75ms"),  # `agent --once`'s compact summary
        (None, {"sep": ""}, "?"),
    ],
)
def test_ms_from_seconds(seconds: float | None, kwargs: dict[str, str], shown: str) -> None:
    assert units.ms_from_seconds(seconds, **kwargs) == shown


def test_a_millisecond_field_is_converted_before_it_is_shown_in_seconds() -> None:
    """The job screen's figures come as *_ms; a formatter that takes seconds would read
    120 ms as 120 s without the conversion."""
    assert units.seconds_from_ms(120) == pytest.approx(0.12)
    assert units.seconds_from_ms(0) == 0
    assert units.seconds_from_ms(None) is None


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.075, "75ms"),
        (0.9994, "999ms"),
        (0.9996, "1.00s"),  # the unit is chosen after rounding: never "1000ms"
        (1.214, "1.21s"),
        (9.994, "9.99s"),
        (9.996, "10.0s"),
        (12.44, "12.4s"),
        (None, "?"),
    ],
)
def test_duration_from_seconds(seconds: float | None, shown: str) -> None:
    assert units.duration_from_seconds(seconds) == shown


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.12, "120 ms"),
        (0.9996, "1000 ms"),  # the timeline chooses the unit before rounding
        (1.0, "1.00 s"),
        (12.345, "12.35 s"),
        (None, "?"),
    ],
)
def test_spaced_duration_from_seconds(seconds: float | None, shown: str) -> None:
    assert units.spaced_duration_from_seconds(seconds) == shown


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (16 * 2**20, "16 MiB"),
        (2**20, "1 MiB"),
        (2**20 - 1, "1023 KiB"),  # rounded down: a bound is never shown larger than it is
        (64 * 1024 + 1023, "64 KiB"),
        (3 * 2**20 + 5, "3 MiB"),
        (0, "0 KiB"),
    ],
)
def test_size_from_bytes(n: int, shown: str) -> None:
    assert units.size_from_bytes(n) == shown


@pytest.mark.parametrize(
    ("n", "shown"),
    [
        (8 * 2**20, "8 MiB"),
        (8 * 2**20 + 1, "8388609 bytes"),  # not a whole MiB: exact, never rounded
        (1000, "1000 bytes"),
        (0, "0 MiB"),
    ],
)
def test_exact_size_from_bytes(n: int, shown: str) -> None:
    assert units.exact_size_from_bytes(n) == shown


@pytest.mark.parametrize(
    ("n", "kwargs", "shown"),
    [
        (None, {}, "?"),
        (80 * 2**30, {}, "80"),
        (int(79.6 * 2**30), {"decimals": 1, "unit": "G"}, "79.6G"),
        (2**29, {"decimals": 1, "unit": "G"}, "0.5G"),
    ],
)
def test_gib_from_bytes(n: int | None, kwargs: dict[str, object], shown: str) -> None:
    assert units.gib_from_bytes(n, **kwargs) == shown  # type: ignore[arg-type]
