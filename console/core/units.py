"""Durations and sizes as the operator reads them: one module, each function named after
the unit it takes, so no caller hands milliseconds to a function that wants seconds.

The formats differ on purpose (a bound in an error, a table cell, a report); each caller
keeps the one its readers and tests know. The TUI's compact cells are `console.tui.format`.
"""

from __future__ import annotations


def ms_from_seconds(seconds: float | None, unknown: str = "?", sep: str = " ") -> str:
    """Seconds as whole milliseconds: "12 ms" (sep="" gives "12ms"); None gives `unknown`."""
    return unknown if seconds is None else f"{seconds * 1000:.0f}{sep}ms"


def seconds_from_ms(ms: float | None) -> float | None:
    """Milliseconds (a wire field named *_ms) as seconds, for the formatters that take
    seconds; None stays unknown."""
    return None if ms is None else ms / 1000


def duration_from_seconds(seconds: float | None, unknown: str = "?") -> str:
    """999ms, 1.21s, 12.4s: the unit is chosen after rounding, so 0.9996 s reads 1.00s."""
    if seconds is None:
        return unknown
    if round(seconds * 1000) < 1000:
        return f"{seconds * 1000:.0f}ms"
    return f"{seconds:.2f}s" if round(seconds, 2) < 10 else f"{seconds:.1f}s"


def spaced_duration_from_seconds(seconds: float | None, unknown: str = "?") -> str:
    """120 ms under a second, 1.50 s from one on (the unit is chosen before rounding,
    as the timeline always showed it: 0.9996 s reads 1000 ms)."""
    if seconds is None:
        return unknown
    return f"{seconds:.2f} s" if seconds >= 1 else f"{seconds * 1000:.0f} ms"


def size_from_bytes(n: int) -> str:
    """A bound rounded down to whole MiB from one MiB on, else whole KiB: "16 MiB", "512 KiB"."""
    return f"{n >> 20} MiB" if n >= 2**20 else f"{n >> 10} KiB"


def exact_size_from_bytes(n: int) -> str:
    """A bound without rounding: "8 MiB" when a whole number of MiB, else "1000 bytes"."""
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n} bytes"


def gib_from_bytes(n: int | None, decimals: int = 0, unit: str = "", unknown: str = "?") -> str:
    """A memory size in GiB: "80" (check's table), "79.6G" (with decimals=1, unit="G")."""
    return unknown if n is None else f"{n / 2**30:.{decimals}f}{unit}"
